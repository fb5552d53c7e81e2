//! Work over the chunks of a range, spread over worker threads.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::ffi;
use crate::numa::Workers;

/// The chunks of `[0, len)`: `chunk` bytes each, the last one shorter.
pub(crate) fn chunks(len: usize, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |i| i * chunk..((i + 1) * chunk).min(len))
}

/// Runs `work(index, range)` once for every chunk of `[0, len)`, the chunks handed out in order
/// to `workers` (each spawned thread bound to the workers' CPUs; with one worker, or one chunk,
/// everything runs on the calling thread, whose placement is left alone). After the first error
/// no further chunk starts; that error is returned once every thread has stopped.
pub(crate) fn for_each_chunk<E: Send>(
    len: usize,
    chunk: usize,
    workers: &Workers,
    work: impl Fn(usize, Range<usize>) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let all: Vec<Range<usize>> = chunks(len, chunk).collect();
    let threads = workers.threads.min(all.len());
    if threads <= 1 {
        return all
            .into_iter()
            .enumerate()
            .try_for_each(|(i, r)| work(i, r));
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                // Placement is a speed-up: a thread that cannot be bound still does its share.
                let _ = ffi::bind_thread(&workers.cpus);
                while !failed.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(r) = all.get(i) else { break };
                    if let Err(e) = work(i, r.clone()) {
                        failed.store(true, Ordering::Relaxed);
                        first_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                        break;
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once_and_the_first_error_stops_the_rest() {
        assert_eq!(chunks(10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
        assert_eq!(chunks(0, 4).count(), 0);
        for threads in [1, 3, 8] {
            let workers = Workers {
                threads,
                cpus: Vec::new(),
            };
            let seen: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
            for_each_chunk(1000, 10, &workers, |i, r| {
                assert_eq!(r, i * 10..i * 10 + 10);
                seen[i].fetch_add(1, Ordering::Relaxed);
                Ok::<(), ()>(())
            })
            .unwrap();
            assert!(seen.iter().all(|n| n.load(Ordering::Relaxed) == 1));

            let ran = AtomicUsize::new(0);
            let r = for_each_chunk(1000, 10, &workers, |i, _| {
                ran.fetch_add(1, Ordering::Relaxed);
                if i == 5 { Err(i) } else { Ok(()) }
            });
            assert_eq!(r, Err(5));
            assert!(
                ran.load(Ordering::Relaxed) < 100,
                "chunks kept starting after the error"
            );
        }
    }
}
