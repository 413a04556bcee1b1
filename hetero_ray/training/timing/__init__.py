"""Where a rank's time goes: step timing, resource readings, and emulated devices (speeds,
curves, and the warm-up that fits the profiler's lines)."""
