"""An engine's own scheduler over hisparse (the tests' and examples' model of one): first come,
first served within a token budget per step, running requests before waiting ones, and — when
the GPU pool is short and nothing is in flight to free it — preemption of the request that
started last (the engine's choice; hisparse only says that memory is short)."""

from collections import deque

import hisparse


class Fcfs:
    def __init__(self, coord: hisparse.Coordinator, token_budget: int, max_query_len: int = 1):
        self.coord = coord
        self.budget = token_budget
        self.max_query_len = max_query_len
        self.waiting = deque()  # ids in arrival order (preempted ones at the front)
        self.running = []  # ids in start order
        self.preemptions = 0

    def admit(self, rid: int, prompt) -> None:
        self.coord.admit(rid, prompt)
        self.waiting.append(rid)

    def finish(self, rid: int) -> None:
        self.coord.finish(rid)
        self.running.remove(rid)

    def _preempt_newest(self) -> int:
        victim = self.running.pop()
        self.coord.preempt(victim)
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    def step(self) -> hisparse.Command:
        """Picks this step's batch and returns its command."""
        coord, budget, pressed = self.coord, self.budget, False
        i = 0
        while i < len(self.running) and budget > 0:
            rid = self.running[i]
            computed, total = coord.num_computed(rid), coord.num_tokens(rid)
            left = total - computed
            if left == 0:
                i += 1
                continue
            prefill = computed < total - 1
            n = min(left, budget) if prefill else min(left, self.max_query_len, budget)
            outcome = coord.schedule(rid, n)
            # A prefill chunk shrinks (halving) to what the pool holds before anyone is preempted.
            while not outcome and outcome.outcome == "no_space" and prefill and n > 1:
                n //= 2
                outcome = coord.schedule(rid, n)
            if outcome:
                budget -= n
                i += 1
            elif outcome.outcome == "wait":
                pressed = True
                i += 1
            else:
                pressed = True
                if self._preempt_newest() != rid:
                    continue  # try this request again with the victim's blocks
        while not pressed and budget > 0 and self.waiting:
            rid = self.waiting[0]
            # Asked first: what the start would schedule (its first chunk, past any prefix hit).
            admission = coord.can_start(rid, budget)
            if not admission or not coord.start(rid, budget):
                break
            self.waiting.popleft()
            self.running.append(rid)
            budget -= admission.tokens
        return coord.build_offload_command()
