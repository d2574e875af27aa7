"""One training run from a composed config: build the parts, check them, fit, record.

Kept apart from the Hydra entry point (app.py) so tests and scripts can call `train(cfg)` with a
config composed in-process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from numdev.attention.registry import AttentionBackend, BackendUnavailable
from numdev.cli.errors import Hangup, RunFailed, UserError, one_line
from numdev.config.objective import objective_of
from numdev.config.preflight import keyword_parameters
from numdev.config.schema import TRAIN, validate
from numdev.models.attention import AttentionCall
from numdev.models.gpt import BYTE_VOCABULARY
from numdev.models.perturb import apply_init_perturbation, parse_perturbation
from numdev.numerics.formats import SEED_LIMIT
from numdev.optimizations import Optimization
from numdev.runs import record
from numdev.runs.atomic import remove_temporaries
from numdev.runs.harm_summary import MORE_HARM
from numdev.runs.layout import CHECKPOINT, RUN_RECORD, WEIGHTS_DIR, RunDir
from numdev.runs.lock import RunLock
from numdev.train.callbacks import connect
from numdev.train.callbacks import results as callback_results
from numdev.train.callbacks.perturbation import PerturbAtStep
from numdev.train.callbacks.snapshots import WeightSnapshots
from numdev.train.checkpoint_io import SafeCheckpointIO, load_checkpoint
from numdev.train.checks import check_accelerator, check_backend, compute_dtype
from numdev.train.distributed import check_launch, precision_plugin
from numdev.train.memory import check_training_memory
from numdev.train.module import TrainModule
from numdev.train.precision import SETTINGS as GEMM_SETTINGS
from numdev.train.tensorboard import TensorBoardLogger, metric_tags
from numdev.train.trackers import build_loggers, choices

log = logging.getLogger(__name__)


def build_model(cfg: DictConfig, backend) -> torch.nn.Module:
    """The model, initialised from seed.init alone: the global RNG is forked, seeded, restored.

    Nothing else touches the initialisation, so runs that differ only in backend, precision,
    data or noise seed start from bit-identical weights. init_perturbation=ulp then moves every
    weight one ulp, init_perturbation={kind: relative, eps} by a relative eps (numdev.models.perturb);
    with a `step` t > 0 that happens at the start of step t instead (build_trainer's PerturbAtStep).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(cfg, "init"))
        model = _a_module(instantiate(cfg.model, attention=backend, _convert_="all"), cfg)
    perturbation = cfg.get("init_perturbation")  # the study's ulp control and the ladder's init rungs
    apply_init_perturbation(model, perturbation, cfg.seed.get("perturbation", 0) if perturbation is not None else 0)
    return model


def build_optimization(cfg: DictConfig) -> Optimization:
    """The run's optimization (conf/train/optimization/; none when the config has no `optimization`)."""
    node = cfg.get("optimization")
    return Optimization() if node is None else instantiate(node)


def build_module(cfg: DictConfig, model: torch.nn.Module, optimization: Optimization | None = None) -> TrainModule:
    """The LightningModule around `model`: the objective (conf/train/objective/: diffusion, causal_lm) with the
    optimizer, learning-rate schedule and noise stream from cfg. A config saved before objectives existed is diffusion's."""
    optimizer = instantiate(cfg.optim.optimizer)
    objective = instantiate(objective_of(cfg))
    return objective(
        model=model,
        optimizer=optimization.optimizer(optimizer) if optimization is not None else optimizer,
        warmup_steps=cfg.optim.warmup_steps,
        cooldown_steps=cfg.optim.get("cooldown_steps", 0),
        max_steps=cfg.trainer.max_steps,
        noise_seed=_seed(cfg, "noise"),
    )


def _seed(cfg: DictConfig, name: str) -> int:
    value = cfg.seed.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise ValueError(f"seed.{name}={value!r} must be a non-negative integer below 2^64 (a 64-bit seed)")
    return value


def check_config(cfg: DictConfig) -> None:
    """Every value the run reads from its config is valid (also called on every job before a sweep starts: numdev.config.preflight)."""
    validate(cfg, TRAIN)  # every declared key's type and range (numdev.config.schema): seeds, threads, steps, ...
    if cfg.trainer.get("max_steps") is None:
        raise ValueError("trainer.max_steps=None must be a positive integer: the data stream is endless")
    for name in ("init", "data", "noise"):
        if cfg.seed.get(name) is None:
            raise ValueError(f"seed.{name}=None must be a non-negative integer below 2^64 (a 64-bit seed)")
    perturbation = parse_perturbation(cfg.get("init_perturbation"))
    if perturbation is not None and perturbation.step >= cfg.trainer.max_steps:
        raise ValueError(f"init_perturbation.step={perturbation.step} is not before trainer.max_steps={cfg.trainer.max_steps}: "
                         "the run would end before training on the perturbed weights; lower the step or raise trainer.max_steps")
    cooldown, warmup = cfg.optim.get("cooldown_steps", 0) or 0, cfg.optim.get("warmup_steps", 0) or 0
    if cooldown and warmup + cooldown > cfg.trainer.max_steps:
        raise ValueError(f"optim.cooldown_steps={cooldown} with optim.warmup_steps={warmup} is more than trainer.max_steps="
                         f"{cfg.trainer.max_steps}: lower the cooldown or raise trainer.max_steps")
    gemm = cfg.precision.get("gemm", "auto")
    if gemm not in GEMM_SETTINGS:
        raise ValueError(f"precision.gemm={gemm!r}: use one of {', '.join(GEMM_SETTINGS)} (numdev.train.precision)")
    _check_claim(cfg)
    _check_workload(cfg)
    _check_heldout(cfg)
    _check_attention(cfg)
    _check_optimizer(cfg)
    _check_optimization(cfg)


def _check_workload(cfg: DictConfig) -> None:
    """The objective and the data go together: next-token prediction reads token windows (data=text), diffusion
    reads captioned images (data=shapes, folder, webdataset)."""
    objective = str((cfg.get("objective") or {}).get("_target_", "")).rsplit(".", 1)[-1]
    tokens = "sequence_length" in cfg.data
    option = {"CausalLMModule": "causal_lm", "DiffusionModule": "diffusion"}.get(objective, objective)
    choice = f"model={cfg.model.get('name')} with objective={option}"
    if objective == "CausalLMModule" and "context_length" not in cfg.model:
        raise ValueError(f"{choice}: model={cfg.model.get('name')} is not a language model (no model.context_length): choose "
                         "model=gpt_tiny, or the objective your model trains with (objective=diffusion, objective=model_loss)")
    if objective == "DiffusionModule" and "patch" not in cfg.model:
        raise ValueError(f"{choice}: model={cfg.model.get('name')} is not a diffusion model (no model.patch): choose the objective "
                         "it trains with (objective=causal_lm, objective=model_loss) or a DiT (model=dit_tiny)")
    if objective == "CausalLMModule" and not tokens:
        raise ValueError(f"{choice} trains on token windows but its data ({cfg.data.get('_target_', '?').rsplit('.', 1)[-1]}) gives "
                         "captioned images: add data=text")
    if objective == "CausalLMModule":
        length, context = cfg.data.get("sequence_length"), cfg.model.get("context_length")
        if isinstance(length, int) and isinstance(context, int) and length > context:
            raise ValueError(f"data.sequence_length={length} is longer than model.context_length={context}: the model has no "
                             "position for the later tokens; shorten the windows or lengthen the context")
        vocabulary = cfg.model.get("vocabulary", (cfg.model.get("config") or {}).get("vocab_size", BYTE_VOCABULARY))  # model=hf*: its config's
        if isinstance(vocabulary, int) and vocabulary < BYTE_VOCABULARY:
            key = "model.vocabulary" if "vocabulary" in cfg.model else "model.config.vocab_size"
            raise ValueError(f"{key}={vocabulary}: data=text's tokens are bytes, 0-255: it needs at least {BYTE_VOCABULARY}")
    if objective == "DiffusionModule" and tokens:
        raise ValueError(f"{choice} trains on captioned images but data=text gives token windows: choose a language model "
                         "(model=gpt_tiny) or image data (data=shapes)")


def _check_heldout(cfg: DictConfig) -> None:
    """Token data holds callbacks.heldout.num_images held-out windows (known from the corpus before the run: a sweep whose
    every job would fail at its start is refused before any job runs; the count's type and range: the schema, above)."""
    node = (cfg.get("callbacks") or {}).get("heldout")
    if not node or not isinstance(node.get("num_images"), int):
        return
    if "sequence_length" in cfg.data and hasattr(get_class(cfg.data._target_), "heldout_dataset"):
        instantiate(cfg.data).heldout_dataset(node.num_images)  # too many: one line naming the windows there are


def _check_attention(cfg: DictConfig) -> None:
    """Build the configured attention backend and the shadow's: a value a constructor refuses (attention.delta=11,
    an unknown output-noise mode), a _target_ that is not an attention backend, or a forward-only backend where
    training needs a backward pass (formats preset fa2_cuda, a kernel without one; a shadow whose gradients are
    compared) fails before any job of a sweep runs, not when its own job starts. A backend this machine cannot
    run is left to the run's own check (numdev.train.checks), which says what to change."""
    backend = _built_backend(cfg.attention, "attention")
    reason = backend.forward_only() if backend is not None else None
    if reason:
        raise ValueError(f"attention={backend.name}: {reason}")
    if cfg.get("shadow") is None:
        return
    shadow = _built_backend(cfg.shadow, "shadow")
    callback = (cfg.get("callbacks") or {}).get("shadow") or {}
    reason = shadow.forward_only("shadow") if shadow is not None else None
    if reason and callback.get("_target_") and callback.get("backward", True):
        raise ValueError(f"attention@shadow={shadow.name}: {reason}; or compare its outputs only: callbacks.shadow.backward=false")


def _built_backend(node: DictConfig, key: str) -> AttentionBackend | None:
    """The backend `node` (config key `key`) builds; None where this machine cannot run it."""
    from hydra.errors import InstantiationException

    from numdev.config.groups import refused

    try:
        backend = instantiate(node)
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, BackendUnavailable):
            return None
        if (isinstance(cause, TypeError) and "unexpected keyword argument" in str(cause)) or "Error locating target" in str(error):
            raise ValueError(refused(error)) from None  # named with its config path
        if isinstance(cause, (ValueError, TypeError)):
            raise ValueError(one_line(cause)) from None
        raise ValueError(f"{key}: {one_line(error)}") from None
    except BackendUnavailable:
        return None
    if not isinstance(backend, AttentionBackend):
        built = f"{type(backend).__module__}.{type(backend).__qualname__}"
        raise ValueError(f"{key}._target_={node.get('_target_')!r} builds a {built}, not an attention backend: use an "
                         "option of attention= (conf/attention/), or a subclass of numdev.attention.registry.AttentionBackend "
                         "(README: A new attention kernel)")
    return backend


def _check_claim(cfg: DictConfig) -> None:
    """A role's claim=more_harm_than names another role in study.claim_than; no other claim takes one."""
    study = cfg.get("study") or {}
    claim, than = study.get("claim"), study.get("claim_than")
    if claim == MORE_HARM and than is None:
        raise ValueError(f"study.claim={MORE_HARM} needs study.claim_than: the role it harms more than, e.g. study.claim_than=delta_1e-1")
    if claim != MORE_HARM and than is not None:
        raise ValueError(f"study.claim_than={than!r} goes with study.claim={MORE_HARM}, not study.claim={claim!r}: "
                         "set study.claim_than=null or the claim")
    if than is not None and than == study.get("role"):
        raise ValueError(f"study.claim_than={than!r} is the role itself: name the role it harms more than")


def _check_optimization(cfg: DictConfig) -> Optimization:
    """The optimization node builds an Optimization whose options are valid (a user's own option file
    with no _target_, one that cannot be imported or is not an Optimization, a list, a bad compile
    mode or submodule): refused now, in one line naming the key, before a directory is created."""
    from hydra.errors import InstantiationException
    from omegaconf import ListConfig

    node = cfg.get("optimization")
    if node is None:
        return Optimization()
    if not isinstance(node, DictConfig):
        kind = "a list" if isinstance(node, ListConfig) else f"{type(node).__name__} {node!r}"
        raise ValueError(f"optimization: its option file holds {kind}, not a mapping with a _target_ (a subclass of "
                         "numdev.optimizations.base.Optimization) and a name: fix the file (conf/train/optimization/*.yaml)")
    target = node.get("_target_")
    if not isinstance(target, str) or not target:
        raise ValueError("optimization: its option file has no _target_: name a subclass of numdev.optimizations.base.Optimization "
                         "(e.g. _target_: numdev.optimizations.fused_adamw.FusedOptimizer)")
    try:
        built = instantiate(node)
    except InstantiationException as error:
        cause = error.__cause__ or error
        if isinstance(cause, (ValueError, UserError)):
            raise ValueError(one_line(cause)) from None
        text = one_line(cause if error.__cause__ is not None else error).split(", set env var HYDRA_FULL_ERROR")[0]
        raise ValueError(f"optimization._target_={target}: {text}: name an importable subclass of "
                         "numdev.optimizations.base.Optimization") from None
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"optimization: {one_line(error)}") from None
    if not isinstance(built, Optimization):
        raise ValueError(f"optimization._target_={target} builds a {type(built).__name__}, not a subclass of "
                         "numdev.optimizations.base.Optimization: name one (conf/train/optimization/*.yaml shows how)")
    check = getattr(built, "check_model", None)
    if check is not None:
        check(_meta_model(cfg))
    return built


def _meta_model(cfg: DictConfig) -> torch.nn.Module | None:
    """The configured model on PyTorch's meta device (nothing allocated), for checks of its structure; None when it cannot be built."""
    try:
        backend = instantiate(cfg.attention)
        with torch.device("meta"):
            model = instantiate(cfg.model, attention=backend, _convert_="all")
    except Exception:  # noqa: BLE001 - the run's own checks say why, later
        return None
    return _a_module(model, cfg)


def _a_module(model, cfg: DictConfig) -> torch.nn.Module:
    """`model` when it is a torch.nn.Module; one line naming model._target_ otherwise."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model._target_={cfg.model.get('_target_')} builds a {type(model).__name__}, not a torch.nn.Module: "
                         "name your model's class (docs/workloads.md#custom)")
    return model


def _check_optimizer(cfg: DictConfig) -> None:
    """Build the configured optimizer over one dummy parameter: any setting it refuses (betas=[],
    a negative eps, a key the optimizer does not take) fails now, before a record is written,
    not at the first step."""
    from hydra.errors import InstantiationException

    spec = cfg.optim.optimizer
    if not isinstance(spec, DictConfig) or not spec.get("_target_"):
        raise ValueError(f"optim.optimizer ({_shown(spec)}) names no optimizer class (_target_): "
                         "set optim.optimizer._target_=torch.optim.AdamW (or another torch.optim class) with _partial_=true, "
                         "or drop the override that deleted or replaced it (~optim.optimizer, ~optim.optimizer._target_, "
                         "optim.optimizer=...)")
    if spec.get("_partial_") is not True:
        raise ValueError(f"optim.optimizer._partial_={spec.get('_partial_')} must be true: numdev-train gives the optimizer "
                         "the model's parameters itself; set optim.optimizer._partial_=true")
    try:
        target = get_class(str(spec._target_))
    except (ImportError, AttributeError, ValueError, TypeError):
        target = None  # not a class, or not importable: the build below says why
    if isinstance(target, type) and not issubclass(target, torch.optim.Optimizer):
        raise ValueError(f"optim.optimizer._target_={spec._target_} is not a torch.optim.Optimizer: "
                         "name an optimizer class (torch.optim.AdamW, torch.optim.SGD, ...)")
    takes = keyword_parameters(str(spec._target_)) if target is not None else None  # None: any keyword, or unknown
    extra = [str(key) for key in spec if not str(key).startswith("_") and takes is not None and str(key) not in takes]
    if extra:
        raise ValueError(f"optim.optimizer ({spec._target_}) has no setting {', '.join(extra)}: delete it "
                         f"({' '.join('~optim.optimizer.' + k for k in extra)}) or choose an optimizer that takes it")
    try:
        optimizer = instantiate(spec)([torch.nn.Parameter(torch.zeros(1))])
    except InstantiationException as error:
        cause = error.__cause__ or error
        raise ValueError(f"optim.optimizer: {one_line(cause)}: fix the optimizer's settings (optim.optimizer.*)") from None
    except (ValueError, TypeError, IndexError, KeyError, RuntimeError) as error:
        raise ValueError(f"optim.optimizer: {type(error).__name__}: {one_line(error)}: fix the optimizer's settings (optim.optimizer.*)") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optim.optimizer._target_={spec._target_} builds an object of class {type(optimizer).__name__}, not a torch.optim.Optimizer: "
                         "name an optimizer class (torch.optim.AdamW, torch.optim.SGD, ...)")


def _shown(value) -> str:
    """A config value as one short line: a mapping's keys, or the value itself."""
    if isinstance(value, DictConfig):
        return "{" + ", ".join(str(key) for key in value) + "}"
    return repr(value)


def check_backend_for(cfg: DictConfig, backend) -> None:
    """The configured backend runs with the configured precision on the configured device, on every kind
    of attention call the model makes (_attention_calls)."""
    device = check_accelerator(cfg.trainer.accelerator)
    check_backend(backend, cfg.precision.name, compute_dtype(cfg.precision.compute), device, _attention_calls(cfg))


def _attention_calls(cfg: DictConfig) -> list[tuple[int, int]]:
    """(heads, head_dim) of the model's attention calls, from its config where numdev knows the model (the DiT's
    image and text calls; a model with heads and hidden), else from its Attention modules built on the meta device
    (a user's model). Read from the config first: a model too large to run is refused by the memory check, not
    built here."""
    model = cfg.model
    if "heads" in model and "hidden" in model:
        calls = [(int(model.heads), int(model.hidden) // int(model.heads))]
        text = model.get("text")
        if text is not None:
            calls.append((int(text.heads), int(text.width) // int(text.heads)))
        return calls
    meta = _meta_model(cfg)
    return sorted({(m.heads, m.head_dim) for m in meta.modules() if isinstance(m, AttentionCall)}) if meta is not None else []


def build_trainer(cfg: DictConfig):
    callbacks = []
    for key, node in cfg.callbacks.items():
        if node is None:
            continue
        if isinstance(node, DictConfig) and "_target_" not in node:  # an experiment tuned a callback this workload turned off
            log.info("callbacks.%s: settings without a _target_ (this workload has no such callback: callbacks=%s): ignored",
                     key, HydraConfig.get().runtime.choices.get("callbacks", "?") if HydraConfig.initialized() else "?")
            continue
        callbacks.append(instantiate(node))
    perturbation = parse_perturbation(cfg.get("init_perturbation"))
    if perturbation is not None and perturbation.step > 0:  # before the snapshot hub: snapshot t holds it
        hub = next((i for i, c in enumerate(callbacks) if isinstance(c, WeightSnapshots)), len(callbacks))
        callbacks.insert(hub, PerturbAtStep(perturbation, cfg.seed.get("perturbation", 0)))
    connect(callbacks)  # the snapshot hub and its listeners (numdev.train.callbacks)
    loggers = build_loggers(cfg.get("logger"))  # numdev.train.trackers: TensorBoard, CSV, MLflow, W&B, any combination
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):  # its HParams view: the run's choices beside these tags' last values
            logger.metric_tags = metric_tags(cfg)
    if not loggers:  # nothing to log learning rates to
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    if not cfg.trainer.get("enable_progress_bar", True):  # Lightning refuses a progress bar it was told not to show
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    # Without numdev's checkpoint callback (callbacks.checkpoint=null: the studies' short runs),
    # Lightning would add its own ModelCheckpoint and write checkpoints/epoch=...ckpt into every run.
    checkpointing = {} if "enable_checkpointing" in cfg.trainer else {
        "enable_checkpointing": any(isinstance(c, ModelCheckpoint) for c in callbacks)}
    trainer = instantiate(
        cfg.trainer,
        plugins=[precision_plugin(cfg), SafeCheckpointIO()],  # atomic writes, weights_only reads
        callbacks=callbacks,
        logger=loggers or False,
        **checkpointing,
    )
    return trainer, loggers


@contextlib.contextmanager
def _hangup_ends_the_run():
    """SIGHUP's default action kills the process with no cleanup (run.json stays "running"):
    while training, it raises Hangup instead. Only the main thread can install a handler."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGHUP"):
        yield
        return

    def hangup(signum, frame):
        raise Hangup

    previous = signal.signal(signal.SIGHUP, hangup)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


# The CUBLAS_WORKSPACE_CONFIG values under which cuBLAS's products are deterministic (Lightning sets the first).
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


def deterministic_cublas(cfg: DictConfig) -> None:
    """With trainer.deterministic on (true or warn), CUBLAS_WORKSPACE_CONFIG set before any CUDA work. torch reads it
    once, at the process's first cuBLAS call, and keeps the answer; the backend probe (check_backend_for) makes that
    call before Lightning's Trainer sets the variable, after which every product under deterministic algorithms
    would raise (the eager backend on a GPU, from its first step)."""
    if cfg.trainer.get("deterministic") and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_DETERMINISTIC:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC[0]


def train(cfg: DictConfig) -> dict:
    """Train as `cfg` says; returns the run record (also in <run_dir>/run.json)."""
    check_config(cfg)
    deterministic_cublas(cfg)
    run_dir = Path(cfg.run_dir)
    if cfg.get("threads") is not None:
        torch.set_num_threads(cfg.threads)
    optimization = build_optimization(cfg)
    # Process-wide settings (e.g. the fp32 matmul precision) hold for this run only: restored after it.
    with optimization.active():
        backend = optimization.attention(instantiate(cfg.attention))
        check_backend_for(cfg, backend)
        check_training_memory(cfg, backend)  # before any allocation: a model or batch that cannot fit is one line
        model = optimization.model(build_model(cfg, backend))  # after the initial weights are drawn
        datamodule = instantiate(cfg.data)
        module = build_module(cfg, model, optimization)
        trainer, loggers = build_trainer(cfg)
        check_launch(trainer)
        rank_zero = trainer.is_global_zero  # under DDP the other ranks train and leave the records to rank 0
        # One live run per directory (rank 0 holds it for the job); released by the kernel if killed.
        with RunLock(run_dir) if rank_zero else contextlib.nullcontext(), _hangup_ends_the_run():
            return _train_locked(cfg, run_dir, backend, module, datamodule, trainer, loggers, rank_zero, optimization)


def _train_locked(cfg, run_dir: Path, backend, module, datamodule, trainer, loggers: list, rank_zero: bool,
                  optimization: Optimization | None = None) -> dict:
    ckpt_path, resumed_from = None, None
    resume = _resume_mode(cfg, run_dir)
    if resume and not (run_dir / CHECKPOINT).is_file() and (run_dir / RUN_RECORD).is_file():
        # A finished run without a checkpoint (callbacks.checkpoint=null: the studies' short runs) is
        # recognised from run.json and its final snapshot: a requeue does nothing, its records stay as they are.
        record.check_resumable(run_dir, cfg)
        done = record.finished_record(run_dir, cfg)
        if done is not None:
            return {**done, "already_finished": True}
    if resume == "restart":  # resume=auto, killed before its first checkpoint: the same run from step 0
        record.check_resumable(run_dir, cfg)
        resumed_from = 0
    elif resume:
        ckpt_path = run_dir / CHECKPOINT
        if not ckpt_path.is_file():
            raise FileNotFoundError(
                f"resume=true but {ckpt_path} does not exist: point hydra.run.dir at the run to resume"
            )
        record.check_resumable(run_dir, cfg)
        resumed_from = int(load_checkpoint(ckpt_path)["global_step"])  # weights_only=True; checks the file
        done = record.finished_record(run_dir, cfg)
        if done is not None:  # a requeue of a finished run: its records stay as they are
            return {**done, "already_finished": True}
    elif rank_zero and _holds_run(run_dir):
        raise ValueError(f"{run_dir} already holds a run: add resume=true to continue it, or use a new run directory")
    if resumed_from is not None:  # the run's own records are checked before anything is written
        run = RunDir(run_dir)
        if run.record.is_file():
            run.read_record()
        if run.instability.is_file():
            run.read_instability()
    datamodule.setup("fit")  # bad data (empty, corrupt, a broken manifest) is refused before any record is written
    run_dir.mkdir(parents=True, exist_ok=True)
    if rank_zero and resumed_from is not None:  # a killed session's half-written temporary files
        for sub in (WEIGHTS_DIR, CHECKPOINT.parent, "."):
            remove_temporaries(run_dir / sub)
    if rank_zero:
        record.write_config(run_dir, cfg)
        run = record.start_record(run_dir, cfg, backend, resumed_from, gemm=_gemm_route(trainer))
    else:
        run = {"status": "running", "global_rank": trainer.global_rank}
    for logger in loggers:  # the run's defining choices (the whole config is its config.yaml)
        logger.log_hyperparams(choices(cfg))
    log.debug("%s %s: %s attention, %s, seeds init/data/noise %s/%s/%s, %d steps%s", "resuming" if resumed_from is not None else "training",
              run_dir, backend.name, cfg.precision.name, cfg.seed.init, cfg.seed.data,
              cfg.seed.noise, cfg.trainer.max_steps, f" from step {resumed_from}" if resumed_from is not None else "")

    def finish(status: str, **fields) -> dict:
        if not rank_zero:
            return {**run, **fields, "status": status}
        return record.finish_record(run_dir, run, status, **fields)

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except BaseException as error:
        interrupted = _signal_of(error)
        step = int(trainer.global_step)
        message = f"interrupted by {interrupted.name} at step {step}" if interrupted else f"{type(error).__name__}: {one_line(error)}"[:500]
        try:
            finish("failed", error=message, final_step=step)
        except OSError:  # e.g. the disk is full: the original error is the one to report
            pass
        if interrupted:
            raise RunFailed(
                f"{message}: {RunDir(run_dir).record} says failed; to continue from the last checkpoint "
                "run the same command with resume=auto", 128 + interrupted
            ) from None
        raise
    results = _results(trainer)
    describe = getattr(datamodule, "describe", None)
    if describe is not None:  # what it trained on (data=text: the corpus, its size and sha256)
        results["data"] = describe()
    if optimization is not None:  # what is active, read inside the run (the setting, the modules, the optimizer)
        results["optimization"] = optimization.describe(module.model, trainer.optimizers[0] if trainer.optimizers else None)
    status = "failed" if "error" in results else "stopped" if "stop_reason" in results else "finished"
    return finish(status, final_step=int(trainer.global_step), **results)


def _gemm_route(trainer) -> dict | None:
    """How this run computes its low-precision matrix products (numdev.train.precision), if it has a say."""
    describe = getattr(trainer.precision_plugin, "describe_route", None)
    return describe() if describe is not None else None


def _signal_of(error: BaseException) -> signal.Signals | None:
    """The signal that ended training: Lightning turns SIGTERM into SIGTERMException and Ctrl-C
    (SIGINT, KeyboardInterrupt) into sys.exit(1) raised while handling it."""
    if isinstance(error, SIGTERMException):
        return signal.SIGTERM
    if isinstance(error, Hangup):
        return signal.SIGHUP
    if isinstance(error, KeyboardInterrupt) or (isinstance(error, SystemExit) and isinstance(error.__context__, KeyboardInterrupt)):
        return signal.SIGINT
    return None


def _holds_run(run_dir: Path) -> bool:
    """A run was started here: a checkpoint, snapshots, or its run.json (a run with neither checkpoints nor snapshots)."""
    return (run_dir / CHECKPOINT).exists() or (run_dir / WEIGHTS_DIR).exists() or (run_dir / RUN_RECORD).exists()


def _resume_mode(cfg: DictConfig, run_dir: Path):
    """resume: true / false as given; auto: true if the run has a checkpoint, "restart" if it holds an
    unfinished run without one (killed before its first checkpoint), false for a new directory."""
    value = cfg.get("resume")
    if isinstance(value, bool):
        return value
    if value != "auto":
        raise ValueError(f"resume={value!r}: use true, false or auto")
    if (run_dir / CHECKPOINT).is_file():
        return True
    return "restart" if _holds_run(run_dir) else False


def _results(trainer) -> dict:
    out = {"world_size": int(trainer.world_size)}
    loss = trainer.callback_metrics.get("loss/train")
    if loss is not None:
        out["final_loss"] = float(loss)
    return {**out, **callback_results(trainer.callbacks)}  # what each callback reports (numdev.train.callbacks.ReportsResults)
