"""The experiment trackers a run logs to: TensorBoard (numdev's, the default), CSV, MLflow and Weights &
Biases, alone or together.

    numdev-train logger=csv                       metrics.csv in <run_dir>/csv (no extra package)
    numdev-train logger=mlflow                    a local MLflow store, outputs/mlflow.db (pip install -e '.[mlflow]')
    numdev-train logger=wandb                     Weights & Biases offline, <run_dir>/wandb (pip install -e '.[wandb]')
    numdev-train 'logger=[tensorboard,csv,mlflow]'  any combination
    numdev-train 'logger=[]'                      none (or ~logger)

Each option of conf/train/logger/ sits under its own name (`logger.<name>._target_`), so options
combine; a node with its own `_target_` at `logger` (a run configured before trackers combined) is one
tracker. Every metric a callback logs goes to every tracker (`log_metrics`), pictures (samples,
histograms) to those that draw them (TensorBoard).

What a tracker is told about the run (`choices`) is the few settings that make it what it is — its
attention, precision, model, optimization, role, seeds, learning rate, steps — not the ~160 keys of
its config (those are in the run's config.yaml); TensorBoard's HParams view shows them beside the
run's loss, held-out loss, caption agreement and deviation (numdev.train.tensorboard.metric_tags: its
distance to the sibling and the shadow's per-call deviation), so a sweep's runs sort by what they changed and how far they moved.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from numdev.cli.errors import UserError

EXTRAS = {  # a tracker's package -> (the option, numdev's extra that installs it)
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}


def build_loggers(node) -> list:
    """The run's trackers from its `logger` node (None or empty: none)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    if node is None or (isinstance(node, DictConfig) and not node):
        return []
    if not isinstance(node, DictConfig):
        raise UserError(f"logger: holds {type(node).__name__} {node!r}, not a tracker's settings: choose logger=tensorboard, "
                        "csv, mlflow, wandb, a list of them (logger=[tensorboard,csv]) or none (logger=[])")
    named = {"logger": node} if "_target_" in node else dict(node.items())
    loggers = []
    for name, settings in named.items():
        if settings is None:
            continue
        key = "logger" if name == "logger" else f"logger.{name}"
        if not isinstance(settings, DictConfig) or "_target_" not in settings:
            raise UserError(f"{key}: has no _target_ (a Lightning logger class): the options of conf/train/logger/ show how, "
                            "e.g. logger=csv")
        _require(key, str(settings["_target_"]))
        try:
            loggers.append(instantiate(settings))
        except InstantiationException as error:
            cause = error.__cause__ or error
            # a module missing (its name), or Lightning's own ModuleNotFoundError naming the distribution it needs
            text = f"{getattr(cause, 'name', None) or ''} {cause}".lower() if isinstance(cause, ModuleNotFoundError) else ""
            package = next((p for p in EXTRAS if p in text), None)
            if isinstance(cause, UserError):  # a setting numdev's own tracker refused, said in full
                raise UserError(str(cause)) from None
            if package is not None:
                option, extra = EXTRAS[package]
                raise UserError(f"{key}: logger={option} needs the {package} package, which is not installed: "
                                f"pip install -e '.[{extra}]' (or choose another tracker, e.g. logger=csv)") from None
            raise UserError(f"{key}: {type(cause).__name__}: {cause}".splitlines()[0]) from None
    return loggers


def _require(key: str, target: str) -> None:
    """The tracker's own package, imported before its logger is built: Lightning would import it only when the
    run first logs (a traceback mid-run), or refuse with its own message."""
    import importlib

    for package, (option, extra) in EXTRAS.items():
        if package in target.lower():
            try:
                importlib.import_module(package)
            except ImportError:
                raise UserError(f"{key}: logger={option} needs the {package} package, which is not installed: "
                                f"pip install -e '.[{extra}]' (or choose another tracker, e.g. logger=csv)") from None


def choices(cfg: DictConfig) -> dict:
    """The run's few defining settings, flat, for the trackers' hyperparameter views."""
    def pick(key: str):
        value = OmegaConf.select(cfg, key, default=None)
        return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)

    keys = {
        "attention": "attention._target_", "precision": "precision.name", "model": "model.name",
        "optimization": "optimization.name", "role": "study.role", "replicate": "study.replicate",
        "seed.init": "seed.init", "seed.data": "seed.data", "seed.noise": "seed.noise",
        "lr": "optim.optimizer.lr", "warmup_steps": "optim.warmup_steps", "cooldown_steps": "optim.cooldown_steps",
        "max_steps": "trainer.max_steps", "batch_size": "data.batch_size", "resolution": "data.resolution",
        "kv_block": "attention.kv_block", "init_perturbation": "init_perturbation",
    }
    out = {name: value for name, key in keys.items() if (value := pick(key)) is not None}
    if isinstance(out.get("attention"), str):
        out["attention"] = out["attention"].rsplit(".", 1)[-1]  # numdev.attention.Eager -> Eager
    return out


def log_metrics(trainer, metrics: dict, step: int) -> None:
    """`metrics` to every tracker of the trainer (none: nothing)."""
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def drawing(trainer):
    """The first tracker that draws figures and histograms (TensorBoard's SummaryWriter), or None."""
    for logger in trainer.loggers:
        experiment = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_figure"):
            return experiment
    return None


@contextlib.contextmanager
def _exclusive(path: Path):
    """An exclusive flock on `path` (made if missing) for the block: one process at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def mlflow_logger(store: str, experiment_name: str, run_name: str | None = None, **kwargs):
    """Lightning's MLFlowLogger on a local SQLite store (MLflow 3 refuses new file stores), shared by every
    run: the store's tables and the experiment are made under a lock first, so the parallel jobs of a
    sweep starting together do not race to create them."""
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    path = Path(store).resolve()
    if path.exists() and not path.is_file():  # MLflow would retry opening it for minutes
        raise UserError(f"logger.mlflow.store={store}: {path} is not a file (a directory?): give the path of the SQLite "
                        "store every run shares, e.g. logger.mlflow.store=outputs/mlflow.db")
    uri = f"sqlite:///{path}"
    with _exclusive(path.with_name(path.name + ".lock")):
        client = MlflowClient(uri)  # makes or upgrades the tables
        if client.get_experiment_by_name(experiment_name) is None:
            client.create_experiment(experiment_name)
    return MLFlowLogger(experiment_name=experiment_name, run_name=run_name, tracking_uri=uri, **kwargs)
