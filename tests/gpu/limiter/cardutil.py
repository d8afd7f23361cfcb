"""The card's own busy figure while a workload runs, for the compute limiter's GPU
section: NVML's utilization of GPU 0 (percent of time one or more kernels ran), sampled
every 100 ms in a thread. In a bare run that is the workload's share of the card, which
is what a limit is judged against (a workload that keeps the card 40% busy bare is not
held back by a limit of 60). Under `vgpu run` the process loads the shim's NVML, so its
figure is the container's view, reported but not judged.

Usage: sampler = CardUtil(); sampler.start(); ...; sampler.stop() -> mean percent or None
(start and stop again for the next stretch: rounds.py's rounds reuse one sampler)
"""
import threading


class CardUtil:
    def __init__(self, period_s=0.1):
        self.period_s = period_s
        self.samples = []
        self.done = threading.Event()
        self.thread = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML: no figure
            self.nvml = None

    def _run(self, done, samples):
        while not done.wait(self.period_s):
            try:
                samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            except Exception:
                pass

    def start(self):
        self.samples = []
        self.done = threading.Event()
        if self.nvml is not None:
            self.thread = threading.Thread(target=self._run, args=(self.done, self.samples), daemon=True)
            self.thread.start()

    def stop(self):
        """Mean utilization over the samples (the first, which covers time before
        start, left out), or None."""
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=2)
        samples = self.samples[1:]
        return round(sum(samples) / len(samples), 1) if samples else None
