"""Mechanistic model of one inference-engine instance with a paged KV pool.

Time advances in steps of ``dt`` seconds. Requests arrive (Poisson), wait FCFS, are admitted
against free KV blocks (minus a watermark) and ``max_num_seqs``, prefill under processor
sharing within a per-step token budget, then decode one token per engine iteration; the
iteration time grows with the running batch. A request's blocks grow with its context; when
the pool runs out the newest running request is preempted (recompute): its KV is freed and it
returns to the head of the queue. Units: seconds, tokens, blocks.

Per-step work is O(events + block_size): decoding requests share one integer token clock
``D`` (a request's context is ``x_i + D``); finishes come off a heap keyed by the clock value
at which each request is done, and the blocks in use, Σ ceil((x_i + D) / block_size), are
kept exact through counts of the residues x_i mod block_size.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from kvwatch.sim.buckets import E2E, GEN_TOKENS, ITL, PROMPT_TOKENS, QUEUE, TPOT_REQ, TTFT, HistBank
from kvwatch.sim.engine_config import EngineConfig
from kvwatch.sim.requests import DECODE, PREFILL, WAIT, ArrivalPool, Req, Shape, share_prefill
from kvwatch.sim.trace import (
    BLOCKED_KV,
    BLOCKED_NONE,
    BLOCKED_POLICY,
    BLOCKED_SLOTS,
    BLOCKED_STALLED,
    COUNTERS,
    GAUGES,
    EngineView,
    Recorder,
)
from kvwatch.sim.workload import Workload

(_PREEMPT, _PROMPT, _GEN, _PQ, _PH, _STOP, _LENGTH, _ABORT, _ARRIVED, _ITER, _QUS,
 _RUS) = (COUNTERS.index(n) for n in (
    "preemptions", "prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits",
    "success_stop", "success_length", "aborted", "arrived", "iterations", "queue_us",
    "request_us"))
_ITL_SPREAD = ((0.85, 0.3), (1.0, 0.45), (1.25, 0.25))  # (value factor, share) per step


class Engine:
    """One engine instance; ``step()`` advances ``config.dt`` seconds."""

    def __init__(self, config: EngineConfig, workload: Workload, *, seed: int | list[int] = 0,
                 recorder: Recorder | None = None) -> None:
        self.cfg, self.workload, self.recorder = config, workload, recorder
        self.rng = np.random.default_rng(seed)
        # a stream of its own for what only a gauge shows: drawing from ``rng`` would move
        # every arrival after it
        self._gauge_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
        self.pool = ArrivalPool(self.rng)
        self.hist = HistBank()
        self.t = self.phase_start = 0.0
        self.c = [0.0] * len(COUNTERS)
        self.g = [0.0] * len(GAUGES)
        self.fresh: deque[Shape] = deque()  # arrived, never admitted (FCFS)
        self.resumed: deque[Req] = deque()  # preempted, ahead of the fresh ones
        self.running: dict[int, Req] = {}  # admission order
        self.prefilling: list[Req] = []
        self._heap: list[tuple[int, int]] = []  # (clock value when done, seq)
        self._seq = 0
        self._clock = 0  # decode tokens given to every decoding request so far
        self._carry = 0.0
        self._cnt = [0] * config.block_size  # decoding requests per residue of x mod bs
        self._sum_q = 0
        self._n_dec = 0
        self._pre_blocks = 0
        self._reserved = 0  # Σ reservations of running requests (reserve_max_output)
        self._alloc = 0.0  # blocks counted against admission
        self._used = 0.0  # blocks holding KV (last accounting plus admissions since)
        self._paused = 0
        self._blocked = BLOCKED_NONE  # why the last admission pass stopped (trace.BLOCKED_*)

    # --- control ---------------------------------------------------------------------
    def reconfigure(self, config: EngineConfig | None = None,
                    workload: Workload | None = None) -> None:
        """Switch limits/policy and/or workload now; the rate shape restarts at t=0."""
        if config is not None:
            if (config.num_blocks, config.block_size) != (self.cfg.num_blocks,
                                                          self.cfg.block_size):
                raise ValueError("pool geometry cannot change without a restart")
            self.cfg = config
            while len(self.running) > config.max_num_seqs:
                self._evict(self.running[next(reversed(self.running))])
        if workload is not None:
            self.workload = workload
        self.pool.clear()
        self.phase_start = self.t

    def restart(self) -> None:
        """Simulated process restart: in-flight requests are lost, counters reset to 0."""
        for req in list(self.running.values()):
            self._leave(req)
        self.fresh.clear()
        self.resumed.clear()
        self._paused, self._alloc, self._used = 0, 0.0, 0.0
        self.c = [0.0] * len(COUNTERS)
        self.hist.reset()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def view(self, wall_time: float = 0.0) -> EngineView:
        """Current state as scalars."""
        return EngineView.from_vectors(self.cfg, np.array(self.g), np.array(self.c),
                                       self.hist.state(), self.hist, wall_time)

    # --- one step --------------------------------------------------------------------
    def step(self) -> None:
        cfg, t, c = self.cfg, self.t, self.c
        lam = self.workload.rate(t - self.phase_start) * cfg.dt
        if lam > 0:
            k = int(self.rng.poisson(lam))
            if k:
                self.fresh.extend(self.pool.take(k, t, cfg, self.workload))
                c[_ARRIVED] += k
        if cfg.client_timeout_s > 0:
            self._timeouts(t - cfg.client_timeout_s)
        ttft_events: list[tuple[float, float]] | None = [] if self.recorder else None
        work = (0.0, 0.0, 0.0, 0.0)
        done0 = c[_STOP] + c[_LENGTH]
        if not cfg.stalled:
            self._admit(t)
            work = self._compute(t, ttft_events)
        used = self._account()
        before = len(self.running)
        if not cfg.stalled and (self.fresh or self.resumed):
            # slots and blocks freed during the step are refilled by the next iteration
            used += self._admit(t + cfg.dt)
        # a gauge read after the step's last iteration misses the requests that finished in it
        # while their slots wait for the next iteration's refill (each finish falls in the last
        # of the step's iterations with probability ITL / dt)
        finished, itl = int(c[_STOP] + c[_LENGTH] - done0), work[3]
        gone = int(self._gauge_rng.binomial(finished, min(1.0, itl / cfg.dt))) if finished and itl > 0 else 0
        shown = len(self.running) - min(gone, len(self.running) - before)
        waiting = len(self.fresh) + len(self.resumed)
        blocked = BLOCKED_STALLED if cfg.stalled and waiting else (self._blocked if waiting
                                                                   else BLOCKED_NONE)
        self.g = [used / cfg.num_blocks, self._alloc / cfg.num_blocks, used, self._alloc,
                  len(self.running), waiting, self._paused, len(self.prefilling), self._n_dec,
                  work[0], work[1] / cfg.dt, work[2] / cfg.dt, work[3], cfg.num_blocks,
                  cfg.max_num_seqs, blocked, shown]  # in the order of trace.GAUGES
        if self.recorder is not None:
            self.recorder.append(t, self.g, c, ttft_events)
        self.t = t + cfg.dt

    def _timeouts(self, limit: float) -> None:
        fresh, resumed = self.fresh, self.resumed
        while resumed and resumed[0].arrival < limit:
            resumed.popleft()
            self._paused -= 1
            self.c[_ABORT] += 1
        while fresh and fresh[0][0] < limit:
            fresh.popleft()
            self.c[_ABORT] += 1
        if self.cfg.stalled:  # frozen running requests time out as well
            while self.running:
                req = self.running[next(iter(self.running))]
                if req.arrival >= limit:
                    break
                self._leave(req)
                self.c[_ABORT] += 1

    def _admit(self, t: float) -> int:
        """Admit FCFS at time ``t`` while slots and blocks allow; returns blocks allocated.

        Requests arriving after ``t`` (within the current step) are scheduled on arrival.
        """
        cfg, running, c = self.cfg, self.running, self.c
        slots = cfg.max_num_seqs - len(running)
        avail = cfg.num_blocks * (1.0 - cfg.watermark_frac) - self._alloc
        bs, reserve_mode = cfg.block_size, cfg.reserve_max_output
        fresh, resumed = self.fresh, self.resumed
        allocated = 0
        self._blocked = BLOCKED_SLOTS if slots <= 0 else BLOCKED_NONE
        while slots > 0 and (resumed or fresh):
            if resumed:
                req = resumed[0]
                blocks = -(-(req.prompt + req.gen) // bs)
                need = req.reserve if reserve_mode else blocks
                if need > avail:
                    self._blocked = self._why(blocks)
                    break  # FCFS: the head does not fit, nothing behind it is admitted
                resumed.popleft()
                self._paused -= 1
                req.seq, req.state, req.blocks = self._seq + 1, PREFILL, blocks
                req.sched = t
                req.left = req.prompt + req.gen - req.cached
            else:
                shape = fresh[0]
                blocks = -(-shape[1] // bs)
                need = shape[5] if reserve_mode else blocks
                if need > avail:
                    self._blocked = self._why(blocks)
                    break
                fresh.popleft()
                req = Req(shape, self._seq + 1, t, blocks)
                c[_PQ] += req.prompt
                c[_PH] += req.cached
            avail -= need
            slots -= 1
            allocated += blocks
            self._used += blocks
            self._alloc += need
            self._reserved += req.reserve
            self._seq += 1
            running[self._seq] = req
            self.prefilling.append(req)
            self._pre_blocks += blocks
        else:
            if (resumed or fresh) and slots <= 0:
                self._blocked = BLOCKED_SLOTS
        return allocated

    def _why(self, blocks: int) -> int:
        """Reason the queue head needing ``blocks`` KV blocks was refused: the blocks are
        taken (KV), or plenty are free but the policy (reservation for the maximum output,
        watermark) holds them back."""
        free = self.cfg.num_blocks - self._used
        # a watermark of a few blocks on a pool that is full anyway is not a policy stall:
        # the policy binds when a tenth of the pool would still be free after admitting
        return BLOCKED_POLICY if free - blocks >= 0.1 * self.cfg.num_blocks else BLOCKED_KV

    def _compute(self, t: float, ttft_events: list[tuple[float, float]] | None
                 ) -> tuple[float, float, float, float]:
        """Prefill, then decode; returns (prefill tokens, prompt tokens done, emitted, ITL)."""
        cfg, c, n = self.cfg, self.c, len(self.running)
        if n == 0:
            return 0.0, 0.0, 0.0, 0.0
        dt, n_dec = cfg.dt, self._n_dec
        step_s = cfg.decode_step_s * cfg.compute_factor * (1.0 + n / cfg.batch_knee)
        prate = cfg.prefill_tokens_per_s / cfg.compute_factor
        pre_done = pre_time = prompt_done = 0.0
        completed: list[tuple[Req, float]] = []
        if self.prefilling:
            share = cfg.max_prefill_share if n_dec else 1.0
            budget = max(cfg.max_num_batched_tokens - n_dec, 0) * dt / step_s
            total = sum(r.left for r in self.prefilling)
            pre_done = min(total, prate * dt * share, budget)
            pre_time = pre_done / prate
            completed, self.prefilling = share_prefill(self.prefilling, pre_done)
        c[_ITER] += dt / step_s
        emitted, itl = float(len(completed)), 0.0
        if completed:  # they decode during the rest of this step, after the prefill part
            prompt_done = self._enter_decode(completed, t, pre_time, prate, ttft_events)
        if self._n_dec and pre_time < dt:
            iters = (dt - pre_time) / step_s
            itl = dt / iters
            x = self._carry + iters
            tok = int(x)
            self._carry = x - tok
            if tok:
                emitted += self._decode(t, tok, pre_time, dt, itl)
        c[_PROMPT] += prompt_done
        c[_GEN] += emitted
        return pre_done, prompt_done, emitted, itl

    def _decode(self, t: float, tok: int, pre_time: float, dt: float, itl: float) -> float:
        """Advance the decode clock by ``tok``; finish done requests; returns tokens emitted."""
        self._clock += tok
        clock, heap, running = self._clock, self._heap, self.running
        decoded = float(tok * self._n_dec)
        span = (dt - pre_time) / tok
        base = t + pre_time
        while heap and heap[0][0] <= clock:
            done_at, seq = heapq.heappop(heap)
            req = running.get(seq)
            if req is None or req.state != DECODE:
                continue  # stale entry of a preempted or aborted request
            over = clock - done_at
            decoded -= over
            self._finish(req, base + (tok - over) * span)
        observe = self.hist.observe_n
        for factor, part in _ITL_SPREAD:
            observe(ITL, itl * factor, decoded * part)
        return decoded

    def _enter_decode(self, completed: list[tuple[Req, float]], t: float, pre_time: float,
                      prate: float, ttft_events: list[tuple[float, float]] | None) -> float:
        """Requests whose prefill completed emit a token and join decoding at the clock.

        Returns the prompt tokens of first-time prefills.
        """
        clock, bs, cnt, heap = self._clock, self.cfg.block_size, self._cnt, self._heap
        ttft_obs = self.hist.pending[TTFT]
        prompt_done = 0.0
        for req, frac in completed:
            self._pre_blocks -= req.blocks
            req.gen += 1
            if req.first is None:
                at = t + frac * pre_time
                own = req.sched + (req.prompt - req.cached) / prate
                req.first = at = at if at > own else own
                ttft_obs.append(at - req.arrival)
                if ttft_events is not None:
                    ttft_events.append((at, at - req.arrival))
                prompt_done += req.prompt
            req.state = DECODE
            req.x = x = req.prompt + req.gen - clock
            req.q, req.r = q, r = divmod(x, bs)
            self._sum_q += q
            cnt[r] += 1
            self._n_dec += 1
            if req.gen >= req.out:
                self._finish(req, req.first)
            else:
                heapq.heappush(heap, (clock + req.out - req.gen, req.seq))
        return prompt_done

    def _leave(self, req: Req) -> None:
        """Take ``req`` out of the running set, returning its KV blocks and reservation."""
        if req.state == DECODE:
            req.gen = req.x + self._clock - req.prompt
            self._sum_q -= req.q
            self._cnt[req.r] -= 1
            self._n_dec -= 1
        elif req.state == PREFILL:
            self.prefilling.remove(req)
            self._pre_blocks -= req.blocks
        self._reserved -= req.reserve
        del self.running[req.seq]
        req.state = WAIT

    def _finish(self, req: Req, at: float) -> None:
        if req.state == DECODE:  # inlined _leave (hot path)
            req.gen = req.out
            self._sum_q -= req.q
            self._cnt[req.r] -= 1
            self._n_dec -= 1
            self._reserved -= req.reserve
            del self.running[req.seq]
            req.state = WAIT
        else:
            self._leave(req)
        if at < req.first:
            at = req.first
        pend, c = self.hist.pending, self.c
        arrival, out = req.arrival, req.out
        e2e = at - arrival
        queue = req.sched - arrival
        pend[E2E].append(e2e)
        pend[QUEUE].append(queue)
        pend[TPOT_REQ].append((at - req.first) / (out - 1 if out > 1 else 1))
        pend[PROMPT_TOKENS].append(req.prompt)
        pend[GEN_TOKENS].append(out)
        c[_LENGTH if out >= req.max_tok else _STOP] += 1
        c[_RUS] += e2e * 1e6
        c[_QUS] += queue * 1e6

    def _evict(self, req: Req) -> None:
        """Send a running request back to the head of the queue (KV freed, recompute)."""
        self._leave(req)
        req.npre += 1
        self._paused += 1
        self.resumed.appendleft(req)

    def _account(self) -> float:
        """Blocks holding KV now (reported usage); preempts the newest on overflow."""
        cfg = self.cfg
        bs, n_dec = cfg.block_size, self._n_dec
        used = self._pre_blocks
        if n_dec:
            q, rho = divmod(self._clock, bs)
            extra = n_dec - (self._cnt[0] if rho == 0 else 0)
            if rho > 1:
                extra += sum(self._cnt[bs - rho + 1:])
            used += self._sum_q + n_dec * q + extra
        if cfg.reserve_max_output:  # reservations (prompt + max_tokens) bound the growth
            self._alloc = float(self._reserved)
            self._used = float(used)
            return float(used)
        if used > cfg.num_blocks:
            for seq in reversed(list(self.running)):
                if used <= cfg.num_blocks or len(self.running) == 1:
                    break
                req = self.running[seq]
                used -= (req.blocks if req.state == PREFILL
                         else -(-(req.x + self._clock) // bs))
                self._evict(req)
                self.c[_PREEMPT] += 1
        self._alloc = self._used = float(used)
        return float(used)


__all__ = ["Engine", "EngineConfig"]
