#!/usr/bin/env python3
"""scaler_ref.py - Megatron's loss-scale rule, written from its
DynamicGradScaler / ConstantGradScaler (megatron/core/optimizer/grad_scaler.py),
checked against what mrun reported (--metrics JSON Lines) step by step.

  scaler_ref.py METRICS.jsonl INITIAL WINDOW HYSTERESIS MIN FIXED INJECTED

FIXED 1: a constant scale (--loss-scale).  INJECTED: comma-separated steps at
which the test put an inf into a gradient: each must be reported skipped.
The rule is fed the skipped flags mrun reported (an fp16 overflow the model
makes by itself is a skip too) and must give the scale of every step, the
skipped count, and the applied lr step count exactly."""
import json
import sys


class DynamicGradScaler:
    """Megatron's rule, as its Python reads (scale, growth and hysteresis trackers)."""

    def __init__(self, initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis):
        self._scale = float(initial_scale)
        self.min_scale = float(min_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self._growth_tracker = 0
        self._hysteresis_tracker = self.hysteresis

    @property
    def scale(self):
        return self._scale

    def update(self, found_inf):
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = self._scale * self.growth_factor


class ConstantGradScaler:
    def __init__(self, initial_scale):
        self._scale = float(initial_scale)

    @property
    def scale(self):
        return self._scale

    def update(self, found_inf):
        pass


def main():
    path, initial, window, hyst, min_scale, fixed, injected = sys.argv[1:8]
    rows = [json.loads(line) for line in open(path)]
    injected = {int(s) for s in injected.split(",") if s}
    sc = ConstantGradScaler(float(initial)) if fixed == "1" else \
        DynamicGradScaler(float(initial), float(min_scale), 2.0, 0.5, int(window), int(hyst))
    skipped, bad, seen = 0, 0, set()
    for r in rows:
        k, found = r["step"], r["skipped"] == 1
        want = sc.scale
        if r["loss_scale"] != want:
            print(f"step {k}: mrun's scale {r['loss_scale']}, Megatron's rule {want}")
            bad += 1
        if k in injected and not found:
            print(f"step {k}: an inf was injected but the step was not skipped")
            bad += 1
        skipped += found
        if r["skipped_steps"] != skipped:
            print(f"step {k}: skipped_steps {r['skipped_steps']}, expected {skipped}")
            bad += 1
        seen.add(r["loss_scale"])
        sc.update(found)
    print(f"{len(rows)} steps, {skipped} skipped, scales seen {sorted(seen)}: "
          f"{'FAIL' if bad else 'PASS'} against Megatron's {'Constant' if fixed == '1' else 'Dynamic'}GradScaler")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
