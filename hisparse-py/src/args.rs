//! Integer arguments whose errors name the argument.
//!
//! PyO3 converts a Python `int` into a Rust integer before the function body runs, and a
//! negative, too large or non-integer value then raises a builtin `OverflowError` or
//! `TypeError` that does not say which argument was wrong ("can't convert negative int to
//! unsigned"). The types here never fail to convert: [`Int`] and [`IntList`] keep the object's
//! value or what was wrong with it, and the body turns a bad one into an
//! `InvalidArgumentError` that names the argument and the range to pass, with [`take_args!`]:
//!
//! ```ignore
//! fn f(gpu_mem: Int<u64>, layers: Option<Int<u32>>) -> PyResult<()> {
//!     take_args!(gpu_mem, layers); // gpu_mem: u64, layers: Option<u32>
//! }
//! ```

use core::fmt::Display;

use pyo3::prelude::*;
use pyo3::types::PySequence;

use crate::errors::invalid;

/// An integer type an argument converts to: its range as the error message writes it.
pub trait Bounded: Copy + for<'a, 'py> FromPyObject<'a, 'py> {
    /// The smallest value.
    const MIN: i128;
    /// The largest value.
    const MAX: i128;
}

macro_rules! bounded {
    ($($t:ty),*) => {$(
        impl Bounded for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        }
    )*};
}
bounded!(u16, u32, u64, usize, i32, i64);

/// What was wrong with a value that did not convert.
#[derive(Debug)]
enum Bad {
    /// An integer outside the type's range (its decimal text).
    OutOfRange(String),
    /// Not an integer at all (its type's name).
    NotAnInteger(String),
}

impl Bad {
    /// Why `obj` did not convert to `T`.
    fn of<T: Bounded>(obj: &Borrowed<'_, '_, PyAny>) -> Bad {
        let is_int = obj.call_method0("__index__").ok();
        match is_int {
            Some(i) => Bad::OutOfRange(
                i.str()
                    .map(|s| truncate(&s.to_string_lossy()))
                    .unwrap_or_else(|_| "the value".into()),
            ),
            None => Bad::NotAnInteger(
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "object".into()),
            ),
        }
    }

    fn into_err<T: Bounded>(self, what: impl Display) -> PyErr {
        let range = format!("an integer from {} to {}", T::MIN, T::MAX);
        match self {
            Bad::OutOfRange(v) => invalid(format!("{what} = {v} is out of range; pass {range}")),
            Bad::NotAnInteger(t) => invalid(format!("{what} has type {t}, not int; pass {range}")),
        }
    }
}

/// Long values are cut in error messages.
fn truncate(s: &str) -> String {
    const MAX: usize = 40;
    if s.len() <= MAX {
        s.to_string()
    } else {
        format!("{}…", &s[..MAX])
    }
}

/// An integer argument: the value, or what was wrong with it (see the module docs).
#[derive(Debug)]
pub struct Int<T>(Result<T, Bad>);

impl<T> Int<T> {
    /// A default value.
    pub const fn new(v: T) -> Self {
        Int(Ok(v))
    }
}

impl<'a, 'py, T: Bounded> FromPyObject<'a, 'py> for Int<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        // The common case costs what a plain `T` argument does.
        Ok(Int(obj.extract::<T>().map_err(|_| Bad::of::<T>(&obj))))
    }
}

/// A sequence of integers (a list, a tuple, a numpy array): the values, or the first bad one.
#[derive(Debug)]
pub struct IntList<T>(Result<Vec<T>, ListBad>);

#[derive(Debug)]
enum ListBad {
    NotASequence(String),
    Item(usize, Bad),
}

impl<'a, 'py, T: Bounded> FromPyObject<'a, 'py> for IntList<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(v) = obj.extract::<Vec<T>>() {
            return Ok(IntList(Ok(v)));
        }
        // Find the first bad element, for the message.
        let Ok(seq) = obj.cast::<PySequence>() else {
            let t = obj
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "object".into());
            return Ok(IntList(Err(ListBad::NotASequence(t))));
        };
        let n = seq.len().unwrap_or(0);
        for i in 0..n {
            let Ok(item) = seq.get_item(i) else { break };
            if item.extract::<T>().is_err() {
                return Ok(IntList(Err(ListBad::Item(
                    i,
                    Bad::of::<T>(&item.as_borrowed()),
                ))));
            }
        }
        let t = obj
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "object".into());
        Ok(IntList(Err(ListBad::NotASequence(t))))
    }
}

/// An argument whose conversion error is raised by the body, naming it.
pub trait Arg {
    /// The converted value.
    type Value;
    /// The value, or an `InvalidArgumentError` naming argument `name`.
    fn take(self, name: &str) -> PyResult<Self::Value>;
}

impl<T: Bounded> Arg for Int<T> {
    type Value = T;
    #[inline]
    fn take(self, name: &str) -> PyResult<T> {
        self.0.map_err(|b| b.into_err::<T>(name))
    }
}

impl<A: Arg> Arg for Option<A> {
    type Value = Option<A::Value>;
    #[inline]
    fn take(self, name: &str) -> PyResult<Self::Value> {
        self.map(|a| a.take(name)).transpose()
    }
}

impl<T: Bounded> Arg for IntList<T> {
    type Value = Vec<T>;
    fn take(self, name: &str) -> PyResult<Vec<T>> {
        self.0.map_err(|b| match b {
            ListBad::NotASequence(t) => invalid(format!(
                "{name} has type {t}, not a sequence of integers; pass a list of integers from {} to {}",
                T::MIN,
                T::MAX
            )),
            ListBad::Item(i, bad) => bad.into_err::<T>(format_args!("{name}[{i}]")),
        })
    }
}

/// Converts each named argument (an [`Arg`]) in place, raising an error that names the first
/// bad one.
macro_rules! take_args {
    ($($name:ident),+ $(,)?) => {
        $( let $name = $crate::args::Arg::take($name, stringify!($name))?; )+
    };
}
pub(crate) use take_args;
