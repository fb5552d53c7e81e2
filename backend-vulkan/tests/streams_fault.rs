//! The conformance suite's cross-stream case must catch a backend that ignores event waits:
//! with `wait_event` turned into a no-op ([`TestShape::ignore_event_waits`]), the
//! second stream's copy runs before the first stream's chain of copies has finished (it runs on
//! another queue, or on the same queue ahead of the chain's unsubmitted tail) and reads stale
//! bytes. The case is repeated a few times; it must fail at least once, and pass every time on
//! the real backend. (On the H200, 2026-12-05, a chain of six copies, ~55 µs there, passed 5 of 5
//! runs with the waits ignored: it finished before the second stream's copy started. The case's
//! chain now runs ~0.4 ms there before it writes the buffer the second stream reads.)

use hisparse_backend_vulkan::{TestShape, VulkanDevice, VulkanOptions};
use hisparse_conformance::check::device_or_skip;
use hisparse_conformance::{CaseError, cases};

const CASE: &str = "streams/event-orders-streams";
const TRIES: usize = 5;

#[test]
fn the_stream_case_fails_when_event_waits_are_ignored() {
    let shape = TestShape {
        ignore_event_waits: true,
        ..TestShape::default()
    };
    let opened = VulkanDevice::open_shaped("", &VulkanOptions::default(), shape);
    let Some(faulty) = device_or_skip(opened).expect("open") else {
        return;
    };
    let all = cases::<VulkanDevice>();
    let case = all
        .iter()
        .find(|c| c.name() == CASE)
        .unwrap_or_else(|| panic!("the suite has no case {CASE}"));
    let failures = (0..TRIES)
        .filter(|_| matches!(case.run(&faulty), Err(CaseError::Fail(_))))
        .count();
    assert!(
        failures > 0,
        "{CASE} passed {TRIES} times on a backend that ignores event waits ({} compute queues)",
        faulty.compute_queues()
    );
    drop(faulty);
    let sound = VulkanDevice::open_strict("").expect("open");
    for _ in 0..TRIES {
        assert_eq!(case.run(&sound), Ok(()), "{CASE} on the real backend");
    }
    eprintln!(
        "{CASE}: failed {failures} of {TRIES} runs with event waits ignored, passed with them"
    );
}
