//! HiSparse configuration and its validation (contract §2).

use core::fmt;

use crate::ops::MAX_HOT_SLOTS;

/// User-facing HiSparse settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HiSparseConfig {
    /// Tokens each decode token selects per sparse layer (2048 for DeepSeek V3.2).
    pub top_k: u32,
    /// Hot-buffer rows per request per hot group. `None` = the default
    /// `(max_query_len + 1) * top_k`: the worst-case union of one step's `max_query_len` top-k
    /// sets (speculative decoding resolves them together against one state) plus one top-k of
    /// LRU slack, so rows the next step reselects survive. Must lie in
    /// `top_k * max_query_len ..= 32768` (LRU slots are 16-bit); a default beyond 32768 is an
    /// error, never capped.
    pub device_buffer_size: Option<u32>,
    /// Mirror rows to host as they are written (row-mirror spans), so sealing a page moves no
    /// data. Default `true`.
    pub eager_host_mirror: bool,
    /// Bytes of pinned host memory a runtime of the layout takes: the source pool and the
    /// indexer host cache pinned beside it (the planner gives the pool the most host blocks
    /// whose pages and indexer pages fit together).
    pub host_budget_bytes: u64,
    /// Token rows one request contributes per decode step: 1 + speculative tokens. Default 1.
    pub max_query_len: u32,
}

impl HiSparseConfig {
    /// Defaults for a model's `top_k` and a host budget: default hot buffer, eager mirroring on,
    /// no speculative tokens.
    pub const fn new(top_k: u32, host_budget_bytes: u64) -> Self {
        HiSparseConfig {
            top_k,
            device_buffer_size: None,
            eager_host_mirror: true,
            host_budget_bytes,
            max_query_len: 1,
        }
    }

    /// Smallest allowed hot buffer: `top_k * max_query_len` (saturating).
    pub const fn min_device_buffer_size(&self) -> u64 {
        self.top_k as u64 * self.max_query_len as u64
    }

    /// The hot buffer size in force, after validation.
    pub fn resolved_device_buffer_size(&self) -> Result<u32, ConfigError> {
        self.validate()?;
        Ok(self.device_buffer_size_unchecked() as u32)
    }

    /// The default hot buffer, `(max_query_len + 1) * top_k` (saturating).
    pub const fn default_device_buffer_size(&self) -> u64 {
        (self.max_query_len as u64 + 1) * self.top_k as u64
    }

    fn device_buffer_size_unchecked(&self) -> u64 {
        match self.device_buffer_size {
            Some(v) => v as u64,
            None => self.default_device_buffer_size(),
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.top_k == 0 {
            return Err(ConfigError::Zero { field: "top_k" });
        }
        if self.max_query_len == 0 {
            return Err(ConfigError::Zero {
                field: "max_query_len",
            });
        }
        if self.host_budget_bytes == 0 {
            return Err(ConfigError::Zero {
                field: "host_budget_bytes",
            });
        }
        let min = self.min_device_buffer_size();
        if min > MAX_HOT_SLOTS as u64 {
            return Err(ConfigError::TopKTooLarge {
                top_k: self.top_k,
                max_query_len: self.max_query_len,
                max: MAX_HOT_SLOTS,
            });
        }
        let v = self.device_buffer_size_unchecked();
        if self.device_buffer_size.is_none() && v > u64::from(MAX_HOT_SLOTS) {
            return Err(ConfigError::DefaultDeviceBufferTooLarge {
                top_k: self.top_k,
                max_query_len: self.max_query_len,
                value: v,
                max: MAX_HOT_SLOTS,
            });
        }
        if v < min {
            return Err(ConfigError::DeviceBufferTooSmall {
                value: v as u32,
                min: min as u32,
            });
        }
        if v > u64::from(MAX_HOT_SLOTS) {
            return Err(ConfigError::DeviceBufferTooLarge {
                value: v as u32,
                max: MAX_HOT_SLOTS,
            });
        }
        Ok(())
    }
}

/// A bad [`HiSparseConfig`] field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field that must be positive is zero.
    Zero {
        /// Field name.
        field: &'static str,
    },
    /// `device_buffer_size` is below `top_k * max_query_len`: one step's selections would not fit.
    DeviceBufferTooSmall {
        /// The value given.
        value: u32,
        /// The minimum.
        min: u32,
    },
    /// `device_buffer_size` exceeds 32768 (LRU slots are 16-bit).
    DeviceBufferTooLarge {
        /// The value given.
        value: u32,
        /// The maximum.
        max: u32,
    },
    /// The default hot buffer `(max_query_len + 1) * top_k` exceeds the largest hot buffer
    /// (`top_k * max_query_len` alone fits): give `device_buffer_size` explicitly or fewer
    /// speculative tokens.
    DefaultDeviceBufferTooLarge {
        /// `top_k`.
        top_k: u32,
        /// `max_query_len`.
        max_query_len: u32,
        /// The default it gives.
        value: u64,
        /// The largest hot buffer.
        max: u32,
    },
    /// `top_k * max_query_len` alone exceeds the largest hot buffer.
    TopKTooLarge {
        /// `top_k`.
        top_k: u32,
        /// `max_query_len`.
        max_query_len: u32,
        /// The largest hot buffer.
        max: u32,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::Zero { field } => write!(f, "config: `{field}` must be greater than 0"),
            ConfigError::DeviceBufferTooSmall { value, min } => write!(
                f,
                "config: `device_buffer_size` = {value} is below top_k * max_query_len = {min}; raise it to at least {min}"
            ),
            ConfigError::DeviceBufferTooLarge { value, max } => write!(
                f,
                "config: `device_buffer_size` = {value} exceeds {max} (LRU slots are 16-bit); lower it"
            ),
            ConfigError::DefaultDeviceBufferTooLarge {
                top_k,
                max_query_len,
                value,
                max,
            } => write!(
                f,
                "config: the default `device_buffer_size` (max_query_len + 1) * top_k = ({max_query_len} + 1) * {top_k} = {value} exceeds {max} (LRU slots are 16-bit); lower max_query_len or give device_buffer_size in {}..={max}",
                u64::from(top_k) * u64::from(max_query_len)
            ),
            ConfigError::TopKTooLarge {
                top_k,
                max_query_len,
                max,
            } => write!(
                f,
                "config: `top_k` = {top_k} times `max_query_len` = {max_query_len} exceeds the largest hot buffer ({max} rows); lower max_query_len"
            ),
        }
    }
}

impl crate::error::Error for ConfigError {
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::InvalidArgument
    }
}

impl core::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bounds() {
        let c = HiSparseConfig::new(2048, 1 << 30);
        assert_eq!(c.resolved_device_buffer_size(), Ok(4096));
        let c2 = HiSparseConfig {
            max_query_len: 4,
            ..c
        };
        // (q + 1) × top_k, not 2 × top_k × q.
        assert_eq!(c2.resolved_device_buffer_size(), Ok(10240));
        let c2 = HiSparseConfig {
            max_query_len: 2,
            ..c
        };
        assert_eq!(c2.resolved_device_buffer_size(), Ok(6144));
        let c3 = HiSparseConfig {
            max_query_len: 15,
            ..c
        };
        assert_eq!(c3.resolved_device_buffer_size(), Ok(32768));
        // q = 16: the default (17 × 2048) is beyond 32768: refused, not capped; an explicit
        // buffer of at least q × top_k still works.
        let c16 = HiSparseConfig {
            max_query_len: 16,
            ..c
        };
        let e = c16.validate().unwrap_err();
        assert_eq!(
            e,
            ConfigError::DefaultDeviceBufferTooLarge {
                top_k: 2048,
                max_query_len: 16,
                value: 34816,
                max: 32768
            }
        );
        assert!(std::format!("{e}").contains("lower max_query_len"));
        let explicit = HiSparseConfig {
            device_buffer_size: Some(32768),
            ..c16
        };
        assert_eq!(explicit.resolved_device_buffer_size(), Ok(32768));
        let c4 = HiSparseConfig {
            max_query_len: 17,
            ..c
        };
        assert!(matches!(
            c4.validate(),
            Err(ConfigError::TopKTooLarge { .. })
        ));
        let small = HiSparseConfig {
            device_buffer_size: Some(2047),
            ..c
        };
        assert_eq!(
            small.validate(),
            Err(ConfigError::DeviceBufferTooSmall {
                value: 2047,
                min: 2048
            })
        );
        let big = HiSparseConfig {
            device_buffer_size: Some(32769),
            ..c
        };
        assert_eq!(
            big.validate(),
            Err(ConfigError::DeviceBufferTooLarge {
                value: 32769,
                max: 32768
            })
        );
        assert_eq!(
            HiSparseConfig::new(0, 1).validate(),
            Err(ConfigError::Zero { field: "top_k" })
        );
        assert_eq!(
            HiSparseConfig::new(1, 0).validate(),
            Err(ConfigError::Zero {
                field: "host_budget_bytes"
            })
        );
    }
}
