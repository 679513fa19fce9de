"""Start-up stages read from SGLang's own log lines, and what counts as progress in one.

A start that stops making progress (a rank waiting for a peer that never comes, a weight
read stuck on a dead mount) prints no error line; the machine watches for silence instead.
The stage names what SGLang was doing when it went quiet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The stages, in the order SGLang 0.5.23 goes through them. "init" is everything outside a
# named stage: imports, argument resolution, process start-up, the steps between stages.
STAGES = ("init", "dist_init", "weights", "cuda_graph", "warmup")

# (stage entered, marker), each read from SGLang 0.5.23's source (site-packages paths):
MARKERS: tuple[tuple[str, str], ...] = (
    ("dist_init", r"Init parallel begin\."),  # srt/distributed/bootstrap.py:115
    ("init", r"Init parallel ends\."),  # srt/distributed/bootstrap.py:190
    ("weights", r"Load weight begin\."),  # srt/model_executor/model_runner.py:1274
    ("init", r"Load weight end\."),  # srt/model_executor/model_runner.py:1373
    # "Capture {role} prefill CUDA graph begin." and "Capture {role} decode {cuda graph}
    # begin." (srt/model_executor/model_runner_components/cuda_graph_setup.py:685, :759)
    ("cuda_graph", r"Capture [^.]*(?i:graph) begin\."),
    ("init", r"Capture [^.]*(?i:graph) end\."),  # cuda_graph_setup.py:696, :788
    # uvicorn's "Uvicorn running on http://..." once the HTTP server is bound; SGLang's
    # warm-up request follows (srt/entrypoints/http_server.py:2600 ends it: ready to roll).
    ("warmup", r"Uvicorn running on "),
)
_MARKER = re.compile("|".join(f"(?P<s{i}>{m})" for i, (_, m) in enumerate(MARKERS)))
# SGLang's record prefix (srt/utils/common.py:2630): its own lines, not a library's.
_RECORD = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?: [^\]]*)?\] ")


def stage_of(line: str) -> str | None:
    """The stage a line of SGLang's own starts, or None."""
    record = _RECORD.match(line)
    if record is None:
        return None
    found = _MARKER.search(line, record.end())
    if found is None or found.lastgroup is None:
        return None
    return MARKERS[int(found.lastgroup[1:])][0]


def is_progress(tail: str, bar: bool) -> bool:
    """Whether output counts as progress: a redrawn progress bar or a record of SGLang's."""
    return bar or _RECORD.match(tail) is not None


@dataclass(frozen=True, slots=True)
class Stalled:
    """No progress within the stage's limit: what the journal and /startupz report."""

    stage: str
    line: str  # the last line the child printed
    silent_s: float  # seconds without progress when it was noticed
