//! An optional profile of where the time goes (`VulkanOptions::profile`), printed to stderr when the
//! device is dropped: per operation (the `Device` method that recorded it, and the first command
//! it recorded: a shader, `vkCmdCopyBuffer` or `vkCmdFillBuffer`) the calls, the commands, the
//! host time spent inside the backend's recording (lock, descriptor writes, parameter uploads,
//! submissions it triggered), and the device time: every batch on a compute lane starts with a
//! timestamp and gets one after each operation, so an operation's device time is the time from
//! the completion of everything before it to the completion of everything up to it. Each
//! timestamp waits for the work before it, so operations that would overlap run one after
//! another while profiling: the figures attribute time, they do not reproduce the unprofiled
//! schedule. Batches on the dedicated transfer lane are counted on the host only.
//!
//! Besides the operations: submissions, host waits (synchronisations, uploads and downloads,
//! event waits on the host) and the time they blocked. Each operation's median device time over
//! its first and its last fifth of timed calls shows whether it slowed down during the run (a
//! GPU lowering its clocks slows every operation; a kernel slowed by its state, one).

use std::fmt::Write as _;

use super::*;

/// Timestamp queries per batch (one at the start, one per operation); a batch is submitted
/// before it runs out.
pub const PROFILE_QUERIES: u32 = 256;

/// One operation's totals.
#[derive(Clone, Debug, Default)]
struct OpStat {
    calls: u64,
    commands: u64,
    host_ns: u64,
    timed: u64,
    device_ns: f64,
    /// Device nanoseconds of each timed call, in order.
    each_ns: Vec<f32>,
}

impl OpStat {
    /// Median device microseconds over the first and over the last fifth of the timed calls.
    fn first_last_us(&self) -> (f64, f64) {
        let n = self.each_ns.len();
        if n == 0 {
            return (0.0, 0.0);
        }
        let fifth = n.div_ceil(5);
        let median = |part: &[f32]| {
            let mut v = part.to_vec();
            v.sort_by(f32::total_cmp);
            f64::from(v[v.len() / 2]) / 1e3
        };
        (
            median(&self.each_ns[..fifth]),
            median(&self.each_ns[n - fifth..]),
        )
    }
}

/// Totals of one device (see the module docs).
#[derive(Debug, Default)]
pub struct Profile {
    ops: Vec<((&'static str, &'static str), OpStat)>,
    submissions: u64,
    timed_batches: u64,
    batch_device_ns: f64,
    host_waits: u64,
    wait_ns: u64,
}

impl Profile {
    fn op(&mut self, key: (&'static str, &'static str)) -> &mut OpStat {
        let i = match self.ops.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.ops.push((key, OpStat::default()));
                self.ops.len() - 1
            }
        };
        &mut self.ops[i].1
    }

    /// One recording call of `op` whose first command was `first`.
    pub fn recorded(&mut self, op: &'static str, first: &'static str, commands: u32, host_ns: u64) {
        let s = self.op((op, first));
        s.calls += 1;
        s.commands += u64::from(commands);
        s.host_ns += host_ns;
    }

    /// A queue submission.
    pub fn submitted(&mut self) {
        self.submissions += 1;
    }

    /// A host wait that blocked for `ns`.
    pub fn waited(&mut self, ns: u64) {
        self.host_waits += 1;
        self.wait_ns += ns;
    }

    /// A completed batch: `ticks[0]` at its start, `ticks[i]` after operation `ops[i - 1]`.
    pub fn batch(&mut self, ops: &[(&'static str, &'static str)], ticks: &[u64], period: f64) {
        if ticks.len() < 2 {
            return;
        }
        self.timed_batches += 1;
        self.batch_device_ns += ticks[ticks.len() - 1].wrapping_sub(ticks[0]) as f64 * period;
        for (i, &key) in ops.iter().enumerate().take(ticks.len() - 1) {
            let s = self.op(key);
            let ns = ticks[i + 1].wrapping_sub(ticks[i]) as f64 * period;
            s.timed += 1;
            s.device_ns += ns;
            s.each_ns.push(ns as f32);
        }
    }

    /// The report printed at the end.
    pub fn report(&self, device: &str) -> String {
        let mut ops = self.ops.clone();
        ops.sort_by(|a, b| b.1.device_ns.total_cmp(&a.1.device_ns));
        let mut out = String::new();
        let _ = writeln!(
            out,
            "vulkan profile of {device} (device time from a timestamp after \
             every operation, so operations do not overlap while profiling):"
        );
        let _ = writeln!(
            out,
            "  {:<22} {:<20} {:>8} {:>9} {:>10} {:>10} {:>11} {:>10} {:>12} {:>12}",
            "operation",
            "first command",
            "calls",
            "commands",
            "host us/op",
            "host ms",
            "device us/op",
            "device ms",
            "first 1/5 us",
            "last 1/5 us"
        );
        let (mut host, mut device) = (0u64, 0f64);
        for ((op, first), s) in &ops {
            let (early, late) = s.first_last_us();
            host += s.host_ns;
            device += s.device_ns;
            let per = |ns: f64, n: u64| if n > 0 { ns / n as f64 / 1e3 } else { 0.0 };
            let _ = writeln!(
                out,
                "  {:<22} {:<20} {:>8} {:>9} {:>10.2} {:>10.2} {:>11.2} {:>10.2} {:>12.2} {:>12.2}",
                op,
                first,
                s.calls,
                s.commands,
                per(s.host_ns as f64, s.calls),
                s.host_ns as f64 / 1e6,
                per(s.device_ns, s.timed),
                s.device_ns / 1e6,
                early,
                late
            );
        }
        let _ = writeln!(
            out,
            "  total: host {:.2} ms recording, device {:.2} ms in operations ({:.2} ms in {} \
             timed batches); {} submissions; {} host waits blocked {:.2} ms",
            host as f64 / 1e6,
            device / 1e6,
            self.batch_device_ns / 1e6,
            self.timed_batches,
            self.submissions,
            self.host_waits,
            self.wait_ns as f64 / 1e6
        );
        out
    }
}

impl Context {
    /// Turns profiling on (before any work).
    pub fn enable_profile(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        st.profile = Some(Profile::default());
    }

    /// The report so far, when profiling.
    pub fn profile_report(&self) -> Option<String> {
        self.lock().profile.as_ref().map(|p| p.report(&self.name))
    }

    /// Prepares a freshly opened batch for timestamps: resets its queries and writes the first.
    pub(super) fn profile_open(&self, sub: &mut Submission, lane: usize) -> Result<()> {
        sub.queries_used = 0;
        sub.query_ops.clear();
        if self.lanes[lane].transfer || self.limits.timestamp_period.is_none() {
            return Ok(());
        }
        if sub.queries == vk::QueryPool::null() {
            let qi = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(PROFILE_QUERIES);
            // SAFETY: valid device; the pool is destroyed with the submission.
            sub.queries = unsafe { self.device.create_query_pool(&qi, None) }
                .map_err(VulkanError::vk("vkCreateQueryPool"))?;
        }
        // SAFETY: `sub.cmd` is recording on a compute-family queue, whose family has timestamp
        // bits; the queries are reset before they are written.
        unsafe {
            self.device
                .cmd_reset_query_pool(sub.cmd, sub.queries, 0, PROFILE_QUERIES);
            self.device.cmd_write_timestamp(
                sub.cmd,
                vk::PipelineStageFlags::TOP_OF_PIPE,
                sub.queries,
                0,
            );
        }
        sub.queries_used = 1;
        Ok(())
    }

    /// After an operation recorded into `sub`: a timestamp once everything before completed.
    pub(super) fn profile_mark(&self, sub: &mut Submission, key: (&'static str, &'static str)) {
        if sub.queries_used == 0 || sub.queries_used >= PROFILE_QUERIES {
            return;
        }
        // SAFETY: recording command buffer; the query was reset at the batch's start.
        unsafe {
            self.device.cmd_write_timestamp(
                sub.cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                sub.queries,
                sub.queries_used,
            )
        };
        sub.queries_used += 1;
        sub.query_ops.push(key);
    }

    /// Folds a completed batch's timestamps into the profile.
    pub(super) fn profile_done(&self, profile: &mut Profile, sub: &Submission) {
        let (Some(period), n) = (self.limits.timestamp_period, sub.queries_used as usize) else {
            return;
        };
        if n < 2 {
            return;
        }
        let mut ticks = vec![0u64; n];
        // SAFETY: the batch completed, so every query it wrote is available.
        let ok = unsafe {
            self.device.get_query_pool_results(
                sub.queries,
                0,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64,
            )
        };
        if ok.is_ok() {
            profile.batch(&sub.query_ops, &ticks, period);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_attribute_each_interval_to_the_operation_that_ended_it() {
        let mut p = Profile::default();
        p.recorded("resolve", "resolve_wg", 1, 4000);
        p.recorded("gather_rows", "gather_1", 1, 2000);
        p.recorded("resolve", "resolve_wg", 1, 6000);
        let ops = [
            ("resolve", "resolve_wg"),
            ("gather_rows", "gather_1"),
            ("resolve", "resolve_wg"),
        ];
        p.batch(&ops, &[100, 110, 130, 150], 1000.0);
        let r = p.op(("resolve", "resolve_wg"));
        assert_eq!((r.calls, r.timed, r.host_ns), (2, 2, 10_000));
        assert_eq!(r.device_ns, 30_000.0);
        assert_eq!(p.op(("gather_rows", "gather_1")).device_ns, 20_000.0);
        assert_eq!(p.batch_device_ns, 50_000.0);
        let text = p.report("test device");
        assert!(text.contains("resolve_wg"), "{text}");
        assert!(text.contains("1 timed batches"), "{text}");
    }
}
