//! Workload generation: deterministic top-k selections with the structure real sparse attention
//! shows.
//!
//! For each (request, index group) a [`TopKStream`] produces one selection per decode step:
//! * an **attention sink**: the first `sink` positions, always selected;
//! * a **local window**: the last `window` positions, always selected;
//! * the rest from **drifting clusters**: a few centres that wander a little every step (and now
//!   and then jump), plus some uniform picks.
//!
//! Adjacent steps overlap: each step keeps all but about `(1 - overlap) * top_k` entries of the
//! previous selection (the new token entering the window counts as one replacement), so the
//! default overlap of 0.9 gives the ~90% adjacent-step overlap reported for DeepSeek V3.2 (contract §6).
//! Surviving entries keep their column, new ones take the freed columns. Positions are distinct
//! within a selection; a context shorter than `top_k` selects every position and pads with `-1`.

/// The workload's generator: the conformance suite's SplitMix64, one stream per purpose.
pub use hisparse_conformance::SplitMix64 as Rng;

/// Shape of the generated selections.
#[derive(Clone, Copy, Debug)]
pub struct Pattern {
    /// Entries per selection.
    pub top_k: u32,
    /// Leading positions always selected.
    pub sink: u32,
    /// Trailing positions always selected.
    pub window: u32,
    /// Number of drifting clusters.
    pub clusters: u32,
    /// Half-width of a cluster, in positions.
    pub cluster_width: u32,
    /// Largest drift of a cluster centre per step, in positions.
    pub drift: u32,
    /// Target share of entries kept from one step to the next, in `[0, 1]`.
    pub overlap: f64,
}

impl Pattern {
    /// The default pattern for a model with the given `top_k`.
    pub fn for_top_k(top_k: u32, overlap: f64) -> Self {
        Pattern {
            top_k,
            sink: (top_k / 32).max(1),
            window: (top_k / 4).max(1),
            clusters: 16,
            cluster_width: 512,
            drift: 16,
            overlap,
        }
    }
}

/// The top-k selections of one (request, index group), step after step.
#[derive(Clone, Debug)]
pub struct TopKStream {
    pattern: Pattern,
    rng: Rng,
    centres: Vec<u32>,
    selection: Vec<i32>,
    member: Vec<u64>,
    len: u32,
    started: bool,
}

impl TopKStream {
    /// A stream for one (request, index group).
    pub fn new(pattern: Pattern, seed: u64, stream: u64) -> Self {
        TopKStream {
            pattern,
            rng: Rng::with_stream(seed, stream),
            centres: Vec::new(),
            selection: vec![-1; pattern.top_k as usize],
            member: Vec::new(),
            len: 0,
            started: false,
        }
    }

    fn is_member(&self, p: u32) -> bool {
        self.member
            .get(p as usize / 64)
            .is_some_and(|w| w >> (p % 64) & 1 == 1)
    }

    fn set_member(&mut self, p: u32, on: bool) {
        let w = p as usize / 64;
        if self.member.len() <= w {
            self.member.resize(w + 1, 0);
        }
        if on {
            self.member[w] |= 1 << (p % 64);
        } else {
            self.member[w] &= !(1 << (p % 64));
        }
    }

    /// The replaceable range `[sink, len - window)` (empty when the context is short).
    fn free_range(&self) -> (u32, u32) {
        let lo = self.pattern.sink.min(self.len);
        let hi = self.len.saturating_sub(self.pattern.window).max(lo);
        (lo, hi)
    }

    /// Draws a position in the free range that is not selected yet (None if there is none).
    fn draw(&mut self) -> Option<u32> {
        let (lo, hi) = self.free_range();
        if hi <= lo {
            return None;
        }
        let span = u64::from(hi - lo);
        for _ in 0..8 {
            let p = if !self.centres.is_empty() && self.rng.unit() < 0.8 {
                let c = self.centres[self.rng.below(self.centres.len() as u64) as usize];
                let w = u64::from(self.pattern.cluster_width.max(1));
                // Triangular offset in (-w, w).
                let off = self.rng.below(w) as i64 - self.rng.below(w) as i64;
                (i64::from(c) + off).clamp(i64::from(lo), i64::from(hi) - 1) as u32
            } else {
                lo + self.rng.below(span) as u32
            };
            if !self.is_member(p) {
                return Some(p);
            }
        }
        // Dense neighbourhood: probe linearly from a random point.
        let start = self.rng.below(span) as u32;
        (0..hi - lo)
            .map(|i| lo + (start + i) % (hi - lo))
            .find(|&p| !self.is_member(p))
    }

    fn move_centres(&mut self) {
        let (lo, hi) = self.free_range();
        if hi <= lo {
            return;
        }
        if self.centres.is_empty() {
            for _ in 0..self.pattern.clusters {
                let c = lo + self.rng.below(u64::from(hi - lo)) as u32;
                self.centres.push(c);
            }
            return;
        }
        let d = i64::from(self.pattern.drift);
        for i in 0..self.centres.len() {
            let c = if self.rng.below(64) == 0 {
                i64::from(lo) + self.rng.below(u64::from(hi - lo)) as i64
            } else {
                i64::from(self.centres[i]) + self.rng.below(2 * d as u64 + 1) as i64 - d
            };
            self.centres[i] = c.clamp(i64::from(lo), i64::from(hi) - 1) as u32;
        }
    }

    fn protected(&self, p: i32) -> bool {
        let (lo, hi) = self.free_range();
        p < 0 || (p as u32) < lo || (p as u32) >= hi
    }

    fn put(&mut self, col: usize, p: u32) {
        let old = self.selection[col];
        if old >= 0 {
            self.set_member(old as u32, false);
        }
        self.selection[col] = p as i32;
        self.set_member(p, true);
    }

    /// Rolls the context back to `len` positions: the entries at `len` or beyond leave the
    /// selection and their columns take the positions of the new local window, then positions
    /// drawn from the clusters (a context of at most `top_k` is reselected whole by
    /// [`TopKStream::step`]).
    fn shrink(&mut self, len: u32) {
        self.len = len;
        let k = self.pattern.top_k as usize;
        if len as usize <= k {
            return;
        }
        let mut holes = Vec::new();
        for col in 0..k {
            let p = self.selection[col];
            if p >= 0 && p as u32 >= len {
                self.set_member(p as u32, false);
                self.selection[col] = -1;
                holes.push(col);
            }
        }
        let (_, hi) = self.free_range();
        let mut window = (hi..len)
            .filter(|&p| !self.is_member(p))
            .collect::<Vec<_>>();
        window.reverse();
        for col in holes {
            // More positions exist than columns, so a hole always finds one.
            if let Some(p) = window.pop().or_else(|| self.draw()) {
                self.put(col, p);
            }
        }
    }

    /// Advances to a context of `len` positions (positions `0..len` exist) and returns the
    /// selection for this step. `len` may decrease — rejected speculative tokens rolled back,
    /// or the first of a step's several rows of one request after the last row of the step
    /// before: no entry is ever at `len` or beyond.
    pub fn step(&mut self, len: u32) -> &[i32] {
        if len < self.len {
            self.shrink(len);
        }
        let old_len = self.len;
        self.len = len;
        let k = self.pattern.top_k as usize;
        if self.len as usize <= k {
            // Short context: every position, then padding.
            for (i, s) in self.selection.iter_mut().enumerate() {
                *s = if i < self.len as usize { i as i32 } else { -1 };
            }
            for p in 0..self.len {
                self.set_member(p, true);
            }
            return &self.selection;
        }
        self.move_centres();
        if !self.started || old_len as usize <= k {
            self.first_selection();
            self.started = true;
            return &self.selection;
        }
        // Columns holding replaceable entries, drawn without repetition.
        let mut cols: Vec<usize> = (0..k)
            .filter(|&c| !self.protected(self.selection[c]))
            .collect();
        let mut budget = ((1.0 - self.pattern.overlap.clamp(0.0, 1.0)) * k as f64).round() as usize;
        // New positions enter the window: each takes the column of a replaceable entry.
        let (_, hi) = self.free_range();
        for p in (old_len..self.len).chain(hi..old_len) {
            if self.is_member(p) {
                continue;
            }
            let Some(col) = self.take_column(&mut cols) else {
                break;
            };
            self.put(col, p);
            budget = budget.saturating_sub(1);
        }
        // Further replacements from the clusters.
        for _ in 0..budget {
            let Some(p) = self.draw() else { break };
            let Some(col) = self.take_column(&mut cols) else {
                break;
            };
            self.put(col, p);
        }
        &self.selection
    }

    /// Removes and returns a random column from `cols`.
    fn take_column(&mut self, cols: &mut Vec<usize>) -> Option<usize> {
        if cols.is_empty() {
            return None;
        }
        let i = self.rng.below(cols.len() as u64) as usize;
        Some(cols.swap_remove(i))
    }

    fn first_selection(&mut self) {
        for s in self.selection.iter_mut() {
            *s = -1;
        }
        self.member.clear();
        let (lo, hi) = self.free_range();
        let mut col = 0;
        for p in (0..lo).chain(hi..self.len) {
            if col == self.selection.len() {
                break;
            }
            self.put(col, p);
            col += 1;
        }
        while col < self.selection.len() {
            let Some(p) = self.draw() else { break };
            self.put(col, p);
            col += 1;
        }
    }
}

/// Share of `b`'s valid entries that also appear in `a` (1.0 when `b` has none).
pub fn overlap(a: &[i32], b: &[i32]) -> f64 {
    let set: std::collections::HashSet<i32> = a.iter().copied().filter(|&p| p >= 0).collect();
    let valid = b.iter().filter(|&&p| p >= 0).count();
    if valid == 0 {
        return 1.0;
    }
    b.iter().filter(|&&p| p >= 0 && set.contains(&p)).count() as f64 / valid as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_selection(sel: &[i32], len: u32, pattern: &Pattern) {
        let mut seen = std::collections::HashSet::new();
        for &p in sel {
            if p >= 0 {
                assert!((p as u32) < len, "{p} beyond context {len}");
                assert!(seen.insert(p), "duplicate {p}");
            }
        }
        for p in 0..pattern.sink.min(len) {
            assert!(seen.contains(&(p as i32)), "sink {p} missing");
        }
        for p in len.saturating_sub(pattern.window)..len {
            assert!(seen.contains(&(p as i32)), "window {p} missing");
        }
    }

    #[test]
    fn selections_have_structure_and_overlap() {
        let pattern = Pattern::for_top_k(2048, 0.9);
        let mut s = TopKStream::new(pattern, 42, 0);
        let mut prev = s.step(16384).to_vec();
        check_selection(&prev, 16384, &pattern);
        assert!(prev.iter().all(|&p| p >= 0));
        let mut total = 0.0;
        for step in 1..=50 {
            let cur = s.step(16384 + step).to_vec();
            check_selection(&cur, 16384 + step, &pattern);
            total += overlap(&prev, &cur);
            prev = cur;
        }
        let mean = total / 50.0;
        assert!((0.88..=0.92).contains(&mean), "mean overlap {mean}");
    }

    #[test]
    fn overlap_is_tunable_and_deterministic() {
        let pattern = Pattern::for_top_k(512, 0.5);
        let mut a = TopKStream::new(pattern, 7, 3);
        let mut b = TopKStream::new(pattern, 7, 3);
        let first = a.step(8192).to_vec();
        assert_eq!(first, b.step(8192));
        let second = a.step(8193).to_vec();
        assert_eq!(second, b.step(8193));
        let o = overlap(&first, &second);
        assert!((0.45..=0.55).contains(&o), "overlap {o}");
        let mut c = TopKStream::new(pattern, 8, 3);
        assert_ne!(first, c.step(8192));
    }

    /// Speculative decoding steps one stream with several rows per step and rolls rejected
    /// tokens back: a shorter context drops the entries beyond it and keeps a full selection.
    #[test]
    fn a_shorter_context_drops_the_positions_beyond_it() {
        let pattern = Pattern::for_top_k(512, 0.9);
        let mut s = TopKStream::new(pattern, 3, 9);
        s.step(8192);
        for len in [8196, 8193, 8194, 8195, 8199, 8192, 8200, 600, 601] {
            let sel = s.step(len).to_vec();
            check_selection(&sel, len, &pattern);
            assert!(sel.iter().all(|&p| p >= 0), "a hole at length {len}");
        }
        // Into a context shorter than top-k and back.
        let sel = s.step(100).to_vec();
        assert_eq!(&sel[..100], &(0..100).collect::<Vec<_>>()[..]);
        assert!(sel[100..].iter().all(|&p| p == -1));
        check_selection(s.step(4096), 4096, &pattern);
    }

    #[test]
    fn short_contexts_select_everything_then_pad() {
        let pattern = Pattern::for_top_k(64, 0.9);
        let mut s = TopKStream::new(pattern, 1, 1);
        let sel = s.step(10).to_vec();
        assert_eq!(&sel[..10], &(0..10).collect::<Vec<_>>()[..]);
        assert!(sel[10..].iter().all(|&p| p == -1));
        // Growing past top_k switches to the structured selection.
        let sel = s.step(200).to_vec();
        check_selection(&sel, 200, &pattern);
        assert!(sel.iter().all(|&p| p >= 0));
        let next = s.step(201).to_vec();
        check_selection(&next, 201, &pattern);
    }
}
