"""Writes the metrics file that remat's `command` trial backend reads.

remat runs your own training command for each recompute policy it tries (a command template
configured on the worker, see worker/README.md) and reads back, per rank, the peak allocated and
reserved bytes and the step times. This callback collects them inside a Megatron Bridge job:

    from remat_metrics_callback import RematMetricsCallback
    pretrain(config, forward_step, callbacks=[RematMetricsCallback()])

It writes ``$REMAT_METRICS_FILE.rank<N>`` (JSON, format in worker/README.md) after every step and
when the job ends, also when it dies of an out-of-memory error, so a crash still leaves figures.
Outside Megatron Bridge, call ``step_end(loss=...)`` after each training step yourself.

Only the standard library and torch are needed; without CUDA the peaks are 0.
"""

import atexit
import json
import os
import sys
import time

try:  # Megatron Bridge's callback base class, when it is installed.
    from megatron.bridge.training.callbacks import Callback as _BridgeCallback
except Exception:  # noqa: BLE001 - any import problem means "not available"
    class _BridgeCallback:  # pylint: disable=too-few-public-methods
        """Stand-in base class when Megatron Bridge is not importable."""


def _torch():
    try:
        import torch  # pylint: disable=import-outside-toplevel
        return torch
    except Exception:  # noqa: BLE001
        return None


def _is_oom(exc):
    torch = _torch()
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return "out of memory" in str(exc).lower()


def _as_float(value):
    try:
        if hasattr(value, "item"):
            value = value.item()
        return float(value)
    except Exception:  # noqa: BLE001
        return None


class RematMetricsCallback(_BridgeCallback):
    """Records per-rank peak memory and step times for remat's command backend."""

    def __init__(self, metrics_file=None, rank=None):
        super().__init__()
        self.metrics_file = metrics_file or os.environ.get("REMAT_METRICS_FILE")
        self._rank = rank
        self.step_times_s = []
        self.losses = []
        self.grad_norms = []
        self.status = "ok"
        self.message = ""
        self.failing_request_bytes = 0
        self._step_start = None
        self._last_end = None
        if self.metrics_file:
            atexit.register(self.write)
            previous = sys.excepthook

            def hook(exc_type, exc, tb):
                self.mark_failure(exc)
                self.write()
                previous(exc_type, exc, tb)

            sys.excepthook = hook

    # ---- Megatron Bridge events ---------------------------------------------------------

    def on_train_start(self, context=None):  # pylint: disable=unused-argument
        self._last_end = self._now()

    def on_train_step_start(self, context=None):  # pylint: disable=unused-argument
        self._step_start = self._now()

    def on_train_step_end(self, context=None):
        loss = None
        loss_dict = getattr(context, "loss_dict", None) if context is not None else None
        if isinstance(loss_dict, dict) and loss_dict:
            loss = loss_dict.get("lm loss", next(iter(loss_dict.values())))
        grad_norm = getattr(context, "grad_norm", None) if context is not None else None
        self.step_end(loss=loss, grad_norm=grad_norm)

    def on_train_end(self, context=None):  # pylint: disable=unused-argument
        self.write()

    # ---- framework-agnostic API ---------------------------------------------------------

    def step_end(self, loss=None, grad_norm=None):
        """Call after each training step (when not driven by Megatron Bridge)."""
        now = self._now()
        start = self._step_start if self._step_start is not None else self._last_end
        if start is not None:
            self.step_times_s.append(now - start)
        self._step_start = None
        self._last_end = now
        loss_value = _as_float(loss)
        if loss_value is not None:
            self.losses.append(loss_value)
        norm_value = _as_float(grad_norm)
        if norm_value is not None:
            self.grad_norms.append(norm_value)
        self.write()

    def mark_failure(self, exc):
        """Records why the job failed: status oom for an out-of-memory error."""
        self.status = "oom" if _is_oom(exc) else "failed"
        self.message = f"{type(exc).__name__}: {exc}"[:500]

    def write(self):
        """Writes this rank's metrics atomically; never raises."""
        if not self.metrics_file:
            return
        try:
            rank = self.rank()
            entry = {
                "rank": rank,
                "status": self.status,
                "message": self.message,
                "step_times_s": self.step_times_s,
                "losses": self.losses,
                "grad_norms": self.grad_norms,
                "failing_request_bytes": self.failing_request_bytes,
            }
            entry.update(self._memory())
            path = f"{self.metrics_file}.rank{rank}"
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump({"ranks": [entry]}, out)
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - metrics must never break training
            print(f"remat metrics: cannot write {self.metrics_file}: {exc}", file=sys.stderr)

    def rank(self):
        """This process's global rank (torch.distributed, else $RANK, else 0)."""
        if self._rank is not None:
            return self._rank
        torch = _torch()
        try:
            if torch is not None and torch.distributed.is_available() and \
                    torch.distributed.is_initialized():
                return torch.distributed.get_rank()
        except Exception:  # noqa: BLE001
            pass
        return int(os.environ.get("RANK", "0"))

    # ---- helpers --------------------------------------------------------------------------

    @staticmethod
    def _now():
        torch = _torch()
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()  # step times must include the GPU work
        return time.perf_counter()

    @staticmethod
    def _memory():
        torch = _torch()
        if torch is None or not torch.cuda.is_available():
            return {"peak_allocated_bytes": 0, "peak_reserved_bytes": 0}
        stats = torch.cuda.memory_stats()
        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
        }
