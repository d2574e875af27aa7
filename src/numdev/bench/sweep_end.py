"""numdev-bench's one end-of-run callback (conf/bench/bench.yaml, hydra.callbacks.sweep_end), in this order:

1. a sweep's figure, when its experiment names one (`figure`: conf/bench/experiment/fig3.yaml and the
   like; a single run draws its own figure before it returns: numdev.bench.app);
2. what to run next (numdev.cli.next_steps).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra.experimental.callback import Callback

from numdev.bench.figure import announce, make_figure
from numdev.cli import next_steps
from numdev.cli.errors import fail

log = logging.getLogger(__name__)


class SweepEnd(Callback):
    def __init__(self, figure: str | None = None):
        if figure is not None:
            from numdev.figures import get

            get(figure)  # an unknown name fails here, before the sweep runs
        self.figure = figure

    def on_run_end(self, config, **kwargs) -> None:
        log.info(next_steps.bench_run(Path(config.hydra.run.dir)))

    def on_multirun_end(self, config, **kwargs) -> None:
        """The sweep's figure, then the next steps; without the figure the command exits 1 with one
        line (Hydra would only warn about a callback's exception)."""
        directory = Path(config.hydra.sweep.dir)
        if self.figure is not None:
            try:
                summary = make_figure(self.figure, directory)
            except Exception as error:
                fail("numdev-bench", f"the sweep's figure {self.figure} was not made ({type(error).__name__}: {error}); "
                     f"its records are in {directory} (numdev-figure {self.figure} {directory} makes it again)", 1)
            announce(self.figure, summary, directory)
        log.info("\n".join(next_steps.bench_sweep(directory)))
