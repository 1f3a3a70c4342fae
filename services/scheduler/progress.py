"""The scheduler's periodic progress log line (one every ``every_s`` seconds):
step rate, queue, free KV blocks and, when speculating, the mean accepted length
over the interval and since start, per-position acceptance, fallback and
unverified steps, and the refitted cost profile."""
from __future__ import annotations

from dspark.scheduler.core.profile_fit import OnlineProfile


class ProgressLog:
    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        # (time, steps, verify steps, tokens committed by verify steps) at the last line
        self._last: tuple[float, int, int, int] | None = None

    def fields(self, core, steps: int, now: float) -> dict | None:
        """The line's fields when one is due (None otherwise); the first call only
        starts the interval."""
        st = core.spec_totals
        mark = (now, steps, st.verify_steps, st.committed_in_verify)
        last, due = self._last, self._last is not None and now - self._last[0] >= self.every_s
        if last is None or due:
            self._last = mark
        if not due:
            return None
        d_steps, d_verify = steps - last[1], st.verify_steps - last[2]
        d_commit = st.committed_in_verify - last[3]
        load = core.load()
        out = dict(steps_per_s=round(d_steps / max(now - last[0], 1e-9), 2),
                   running=load["num_running"], waiting=load["num_waiting"],
                   free_kv_blocks=load["free_kv_blocks"])
        if core.num_spec:
            out.update(mean_accepted_length=round(d_commit / d_verify, 3) if d_verify else None,
                       mean_accepted_length_total=round(st.mean_accepted_length, 3),
                       per_position_acceptance=[round(x, 3)
                                                for x in st.per_position_acceptance],
                       fallback_steps=st.fallback_steps,
                       unverified_steps=st.unverified_steps)
            if isinstance(core.sps_profile, OnlineProfile):  # refitted so far
                cur = core.sps_profile.current()
                out["sps_forward_ms"] = dict(zip(cur.rows, (round(x, 1)
                                                            for x in cur.forward_ms)))
        return out
