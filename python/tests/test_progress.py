"""The progress contract from the Python side: the sealed JSON of api/src/progress.rs's
Progress, as api/src/checksummed.rs seals it. The Rust side reads what this package writes
(launch/tests/python.rs); here the package reads what Rust sealed (fixtures/, written by
api/src/progress.rs's test `the_python_packages_fixture_is_what_rust_seals`)."""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from ferrotrain._crc32c import crc32c  # noqa: E402
from ferrotrain._progress import Reporter  # noqa: E402
from ferrotrain._sealed import open_sealed, seal  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class SealTest(unittest.TestCase):
    def test_crc32c_is_castagnolis(self):
        # RFC 3720's check value, and the empty string.
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(crc32c(b""), 0)

    def test_a_file_rust_sealed_opens_and_a_changed_byte_is_seen(self):
        with open(os.path.join(FIXTURES, "progress-sealed-by-rust.json"), "rb") as f:
            data = f.read()
        report = open_sealed(data)
        self.assertEqual(report["step"], 1234)
        self.assertEqual(report["phase"], "training")
        self.assertEqual(report["healedFrom"], "peers")
        with self.assertRaisesRegex(ValueError, "damaged"):
            open_sealed(data.replace(b"1234", b"1235", 1))

    def test_what_this_package_seals_opens_and_a_changed_byte_is_seen(self):
        data = seal({"step": 7, "loss": 2.5})
        self.assertEqual(open_sealed(data)["step"], 7)
        with self.assertRaisesRegex(ValueError, "damaged"):
            open_sealed(data.replace(b"2.5", b"2.6"))


class ReporterTest(unittest.TestCase):
    def test_rates_loss_and_eta_are_the_trainers_over_a_window_of_20_steps(self):
        clock = Clock()
        r = Reporter(None, world_size=2, clock=clock, wall=lambda: 1_800_000_000.0)
        for step in range(1, 31):
            clock.t += 0.5
            r.record(step, loss=float(step), tokens=1000, samples=10, total_steps=100)
        p = r.report()
        self.assertAlmostEqual(p["stepsPerSecond"], 2.0)
        self.assertAlmostEqual(p["stepTimeSeconds"], 0.5)
        self.assertAlmostEqual(p["tokensPerSecond"], 2000.0)
        self.assertAlmostEqual(p["samplesPerSecond"], 20.0)
        # The mean loss of the last 20 steps (11..30), and 70 steps left at 2 a second.
        self.assertAlmostEqual(p["loss"], 20.5)
        self.assertAlmostEqual(p["etaSeconds"], 35.0)
        self.assertEqual((p["step"], p["totalSteps"], p["worldSize"], p["samples"]), (30, 100, 2, 300))
        self.assertTrue(p["attemptFirstStepTime"].endswith("Z"))

    def test_an_evaluation_is_kept_with_the_best_and_written_at_once(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "rank-0.progress.json")
            clock = Clock()
            r = Reporter(path, world_size=1, clock=clock)
            r.record(1, loss=3.0)
            r.record(2, loss=float("nan"), eval_loss=2.0)
            clock.t += 0.1
            r.record(3, eval_loss=2.5)
            with open(path, "rb") as f:
                p = open_sealed(f.read())
            self.assertEqual((p["evalLoss"], p["evalStep"], p["bestEvalLoss"]), (2.5, 3, 2.0))
            self.assertEqual(p["loss"], 3.0, "a loss that is not finite is left out")
            self.assertNotIn("etaSeconds", p, "no total_steps, no ETA")

    def test_a_report_is_written_at_most_once_a_second_and_is_json_with_no_nan(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.json")
            clock = Clock()
            r = Reporter(path, world_size=1, clock=clock)
            r.record(1, loss=1.0)
            clock.t += 0.2
            r.record(2, loss=1.0)
            with open(path, "rb") as f:
                self.assertEqual(json.loads(f.read())["step"], 1)
            clock.t += 1.0
            r.record(3, loss=1.0)
            with open(path, "rb") as f:
                self.assertEqual(json.loads(f.read())["step"], 3)


if __name__ == "__main__":
    unittest.main()
