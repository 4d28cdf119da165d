"""bench/fidelity/peak_phases.py's reading of the allocator's history and its phase recorder (no
GPU: a stand-in for torch.cuda's counters). Run by ctest: python3 fidelity_peak_phases_test.py
SOURCE_DIR."""

import os
import sys
import unittest

SOURCE = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SOURCE, "bench", "fidelity"))

import peak_phases  # noqa: E402

MIB = 1 << 20
TORCH_FRAME = {"filename": "/py/site-packages/torch/nn/functional.py", "line": 1, "name": "silu"}


def frame(path, line, name):
    return [TORCH_FRAME, {"filename": "/carry/megatron/core/" + path, "line": line, "name": name}]


def alloc(addr, mib, frames=()):
    return {"action": "alloc", "addr": addr, "size": mib * MIB, "frames": list(frames)}


def free(addr, mib, action="free_requested"):
    return {"action": action, "addr": addr, "size": mib * MIB}


class LiveAtPeakTest(unittest.TestCase):
    def test_what_is_live_at_the_highest_total(self):
        trace = [
            alloc(1, 100, frame("a.py", 1, "fa")),
            alloc(2, 50, frame("b.py", 2, "fb")),
            free(9, 10),  # allocated before the history began: ignored
            alloc(3, 50, frame("b.py", 2, "fb")),
            free(3, 50), free(3, 50, "free_completed"),
            free(1, 100),
            alloc(4, 120),  # after the peak: 50 + 120 live then
        ]
        best, rows = peak_phases.live_at_peak(trace)
        self.assertEqual(best, 200 * MIB)  # a, then b twice: 100 + 50 + 50
        self.assertEqual(rows, [
            (100 * MIB, 2, "megatron/core/b.py:2 fb [50.00 MiB each]"),
            (100 * MIB, 1, "megatron/core/a.py:1 fa [100.00 MiB each]")])

    def test_blocks_without_python_frames_are_told_apart_by_size(self):
        trace = [alloc(1, 250), alloc(2, 500), alloc(3, 250)]
        best, rows = peak_phases.live_at_peak(trace)
        self.assertEqual(best, 1000 * MIB)
        self.assertEqual(rows, [(500 * MIB, 2, "(torch) ? [250.00 MiB each]"),
                                (500 * MIB, 1, "(torch) ? [500.00 MiB each]")])


class FakeCuda:
    def __init__(self):
        self.cur = self.peak = 0

    def memory_allocated(self):
        return self.cur

    def max_memory_allocated(self):
        return self.peak

    def reset_peak_memory_stats(self):
        self.peak = self.cur

    def move(self, mib):
        self.cur += mib * MIB
        self.peak = max(self.peak, self.cur)


class FakeTorch:
    def __init__(self):
        self.cuda = FakeCuda()


class RecorderTest(unittest.TestCase):
    def test_each_segment_has_its_own_start_and_peak(self):
        torch = FakeTorch()
        rec = peak_phases.Recorder(torch)
        torch.cuda.move(1000)  # static
        rec.begin_step()
        torch.cuda.move(400)  # forward
        rec.boundary("loss_fwd")
        torch.cuda.move(750)
        torch.cuda.move(-250)
        rec.boundary("loss_bwd")
        torch.cuda.move(300)
        torch.cuda.move(-300)
        rec.boundary("head_bwd")
        rec.boundary(None)
        (segs,) = rec.steps
        got = [(s["segment"], s["start_mib"], s["peak_mib"]) for s in segs]
        self.assertEqual(got, [("forward", 1000, 1400), ("loss_fwd", 1400, 2150),
                               ("loss_bwd", 1900, 2200), ("head_bwd", 1900, 1900)])
        rec.boundary("layer0_bwd")  # outside a step: ignored
        self.assertEqual(len(rec.steps), 1)


if __name__ == "__main__":
    unittest.main()
