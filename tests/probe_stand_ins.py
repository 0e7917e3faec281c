"""Stand-in probe workers for tests of where the search starts workers (no processes)."""


class StandInWorker:
    """A worker for tests of where run_search starts workers: `reply(batch)` is its trial's reply.
    run_trial is begin_trial then finish_trial, as in worker.Worker."""

    step_seconds_per_sample = None
    trials_run = 0
    forked = False
    started_ahead = False

    def run_trial(self, batch):
        self.begin_trial(batch)
        return self.finish_trial()

    def begin_trial(self, batch):
        self.trials_run, self.batch = self.trials_run + 1, batch

    def finish_trial(self):
        return self.reply(self.batch)

    def close(self, at_once=False):
        pass


def start_stand_ins(monkeypatch, start_worker):
    """fresh_workers' three ways to start a worker all go to `start_worker(setup, server=None)`."""
    from edgebatch.probing import fresh_workers

    monkeypatch.setattr(fresh_workers, "start_worker", start_worker)
    monkeypatch.setattr(fresh_workers, "spawn_worker", start_worker)
    monkeypatch.setattr(fresh_workers, "await_ready", lambda worker: worker)
