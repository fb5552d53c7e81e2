//! One call at a time per handle: the state of a handle that calls change (a coordinator, a
//! runtime) sits behind a flag each call takes without waiting, so a call made while another
//! thread's call on the same handle is still running gets `HS_STATUS_CONCURRENT_USE` instead of
//! a data race; and a handle whose call panicked answers every later call with
//! `HS_STATUS_INTERNAL` (its state may be half-changed) until it is freed.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Failure, HsStatus, concurrent_use, deref, guard, internal, output_array};

const FREE: u8 = 0;
const BUSY: u8 = 1;
const POISONED: u8 = 2;

/// A handle's state and the flag that gives it to one call at a time.
pub(crate) struct Exclusive<T> {
    flag: AtomicU8,
    state: UnsafeCell<T>,
}

// SAFETY: the state is reached only through `Entered`, which exists for one call at a time
// (the flag's compare-exchange hands it out once until it is dropped), so sharing the
// `Exclusive` between threads shares no access to `T` beyond moving it from one thread to the
// next: `T: Send` is what that needs.
unsafe impl<T: Send> Sync for Exclusive<T> {}

impl<T> Exclusive<T> {
    /// `state`, free.
    pub(crate) fn new(state: T) -> Self {
        Exclusive {
            flag: AtomicU8::new(FREE),
            state: UnsafeCell::new(state),
        }
    }

    /// The state for this call, or the status saying why not (`what` names the handle).
    fn enter(&self, what: &str) -> Result<Entered<'_, T>, Failure> {
        match self
            .flag
            .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => Ok(Entered { cell: self }),
            Err(POISONED) => Err(internal(format!(
                "`{what}` is unusable: an earlier call on it failed inside hisparse (an internal error) and may have left it half-changed; free it"
            ))),
            Err(_) => Err(concurrent_use(what)),
        }
    }
}

/// The states behind handles move between the threads that call them: each must be `Send` (the
/// backends' device types are; the CUDA and ROCm backends make their context current on the
/// calling thread at every call).
const _: () = {
    const fn send<T: Send>() {}
    send::<hisparse_core::coordinator::Coordinator>();
    send::<crate::runtime::RuntimeState>();
};

/// A handle type whose state is an [`Exclusive`].
pub(crate) trait Handle {
    /// The state.
    type State;
    /// The cell holding it.
    fn cell(&self) -> &Exclusive<Self::State>;
}

/// The state of the handle at `p` for this call (NULL, another call in progress and a poisoned
/// handle are refused, naming `what`).
///
/// # Safety
///
/// `p` is NULL or a live handle that outlives `'a`.
pub(crate) unsafe fn enter<'a, H: Handle + 'a>(
    p: *const H,
    what: &str,
) -> Result<Entered<'a, H::State>, Failure> {
    // SAFETY: forwarded contract; only shared references to the handle are ever made.
    unsafe { deref(p, what) }?.cell().enter(what)
}

/// The body of an entry point that answers an array computed from a handle's state: the handle
/// entered (as [`enter`], named `what`) and the output array checked (as
/// [`output_array`](crate::error::output_array)) first, then `array` of the state copied into
/// `out` as `OutArray::fill` does.
///
/// # Safety
///
/// `handle` as [`enter`] takes it; `out`, `capacity` and `count` as `output_array` takes them.
pub(crate) unsafe fn answer_entered_array<H: Handle, T: Copy>(
    handle: *const H,
    what: &str,
    out: *mut T,
    capacity: usize,
    count: *mut usize,
    array: impl FnOnce(&H::State) -> Vec<T>,
) -> HsStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (state, out) = unsafe {
            (
                enter(handle, what)?,
                output_array(out, capacity, count, "out")?,
            )
        };
        out.fill(&array(&state))
    })
}

/// As [`enter`], with NULL meaning no handle (`None`).
///
/// # Safety
///
/// As [`enter`].
pub(crate) unsafe fn enter_opt<'a, H: Handle + 'a>(
    p: *const H,
    what: &str,
) -> Result<Option<Entered<'a, H::State>>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    unsafe { enter(p, what) }.map(Some)
}

/// The state of a handle, held by one call until dropped.
pub(crate) struct Entered<'a, T> {
    cell: &'a Exclusive<T>,
}

impl<T> Deref for Entered<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this `Entered` holds the flag: no other reference to the state exists.
        unsafe { &*self.cell.state.get() }
    }
}

impl<T> DerefMut for Entered<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only borrow of the `Entered`.
        unsafe { &mut *self.cell.state.get() }
    }
}

impl<T> Drop for Entered<'_, T> {
    fn drop(&mut self) {
        // A call that panics while it holds the state may leave it half-changed.
        let next = if std::thread::panicking() {
            POISONED
        } else {
            FREE
        };
        self.cell.flag.store(next, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::HsStatus;

    fn status(r: Result<Entered<'_, u32>, Failure>) -> HsStatus {
        match r {
            Ok(_) => HsStatus::Ok,
            Err(f) => f.status(),
        }
    }

    #[test]
    fn a_second_call_while_the_first_holds_the_state_is_concurrent_use() {
        let cell = Exclusive::new(7u32);
        let mut first = cell.enter("runtime").unwrap();
        *first += 1;
        assert_eq!(status(cell.enter("runtime")), HsStatus::ConcurrentUse);
        drop(first);
        assert_eq!(
            *cell.enter("runtime").unwrap(),
            8,
            "free again, the change kept"
        );
    }

    #[test]
    fn a_call_that_panics_leaves_the_handle_refusing_every_later_call() {
        let cell = Exclusive::new(0u32);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut held = cell.enter("coordinator").unwrap();
            *held = 1;
            panic!("a bug");
        }));
        assert!(r.is_err());
        assert_eq!(status(cell.enter("coordinator")), HsStatus::Internal);
    }

    #[test]
    fn the_state_moves_between_threads_one_call_at_a_time() {
        let cell = Exclusive::new(Vec::<u32>::new());
        std::thread::scope(|s| {
            for t in 0..4 {
                let cell = &cell;
                s.spawn(move || {
                    for i in 0..1000 {
                        // Retry on concurrent use: every call eventually gets the state once.
                        loop {
                            if let Ok(mut v) = cell.enter("runtime") {
                                v.push(t * 1000 + i);
                                break;
                            }
                            std::hint::spin_loop();
                        }
                    }
                });
            }
        });
        let v = cell.enter("runtime").unwrap();
        assert_eq!(v.len(), 4000, "no push was lost to a race");
    }
}
