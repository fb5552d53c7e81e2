//! The step's slot mapping on the device: for every token a step computes, the row it writes in
//! each GPU group's view ([`hisparse_core::layout::LayerView`]), so the engine's forward pass
//! writes its KV and indexer keys with one indexed copy per layer and no host lists.

use hisparse_core::Device;
use hisparse_core::coordinator::OffloadCommand;
use hisparse_core::layout::{GroupKind, KvCacheConfig, LayerView};
use hisparse_core::ops::{TableWrite, TableWriteDesc};

use crate::error::RuntimeError;
use crate::tables::Tables;

/// The slot-mapping buffer and what it holds now.
pub(crate) struct SlotMapping<D: Device> {
    /// `i32[groups.len()][capacity]`.
    pub(crate) buf: D::Buffer,
    /// Per row of the buffer: the layout group and the view of its first layer (every layer of
    /// a group shares its block table, so the row serves all of them).
    pub(crate) groups: Vec<(usize, LayerView)>,
    pub(crate) capacity: u32,
    /// Tokens of the step written last: entries at or beyond it are `-1` on the device.
    pub(crate) tokens: u32,
    writes: Vec<TableWrite>,
}

impl<D: Device> SlotMapping<D> {
    /// The write groups of `kv` — every resident bucket, the indexer group, every regular group,
    /// in layout order — and a `-1`-filled buffer of `capacity` tokens each.
    pub(crate) fn new(
        dev: &D,
        kv: &KvCacheConfig,
        capacity: u32,
    ) -> Result<Self, RuntimeError<D::Error>> {
        let groups: Vec<(usize, LayerView)> = (0..kv.groups.len())
            .filter(|&g| {
                matches!(
                    kv.groups[g].kind,
                    GroupKind::Resident | GroupKind::Indexer | GroupKind::Regular
                )
            })
            .map(|g| {
                kv.layer_view(g, 0).map(|v| (g, v)).ok_or_else(|| {
                    RuntimeError::Command(format!(
                        "layout group {g} has no view of the device pool; re-plan the layout"
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        let len = groups.len() * capacity as usize;
        let mut buf = dev
            .alloc(len.max(1) * 4)
            .map_err(RuntimeError::device("allocating the slot mapping"))?;
        dev.upload_i32(&mut buf, 0, &vec![-1; len])
            .map_err(RuntimeError::device("initialising the slot mapping"))?;
        Ok(SlotMapping {
            buf,
            groups,
            capacity,
            tokens: 0,
            writes: Vec::new(),
        })
    }

    /// Device bytes for `groups` write groups of `capacity` tokens.
    pub(crate) fn bytes(kv: &KvCacheConfig, capacity: u32) -> u64 {
        let groups = kv
            .groups
            .iter()
            .filter(|g| {
                matches!(
                    g.kind,
                    GroupKind::Resident | GroupKind::Indexer | GroupKind::Regular
                )
            })
            .count() as u64;
        groups * u64::from(capacity) * 4
    }

    /// Tokens `cmd` schedules.
    pub(crate) fn step_tokens(cmd: &OffloadCommand) -> u64 {
        cmd.scheduled.iter().map(|s| u64::from(s.num_tokens)).sum()
    }

    /// Writes the slot mapping of `cmd` (its scheduled tokens in command order) from the tables'
    /// shadows, which already hold the command's updates, on `stream`; entries the last step
    /// wrote beyond this step's tokens become `-1`. The caller checked the token count against
    /// the capacity.
    pub(crate) fn write(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        tables: &Tables<D>,
        cmd: &OffloadCommand,
    ) -> Result<(), RuntimeError<D::Error>> {
        let cap = self.capacity;
        self.writes.clear();
        let mut t = 0u32;
        for s in &cmd.scheduled {
            for (w, (group, view)) in self.groups.iter().enumerate() {
                let row = tables.group_row(*group, s.slot).unwrap_or(&[]);
                for i in 0..s.num_tokens {
                    let value = view
                        .token_row(row, s.first_token + i)
                        .and_then(|r| i32::try_from(r).ok())
                        .unwrap_or(-1);
                    self.writes.push(TableWrite {
                        index: w as u32 * cap + t + i,
                        value,
                    });
                }
            }
            t += s.num_tokens;
        }
        for w in 0..self.groups.len() as u32 {
            for i in t..self.tokens {
                self.writes.push(TableWrite {
                    index: w * cap + i,
                    value: -1,
                });
            }
        }
        self.tokens = t;
        if self.writes.is_empty() {
            return Ok(());
        }
        // The table write takes strictly increasing indices.
        self.writes.sort_unstable_by_key(|w| w.index);
        dev.write_table(
            stream,
            &TableWriteDesc {
                table_len: self.groups.len() as u32 * cap,
            },
            &self.writes,
            &mut self.buf,
        )
        .map_err(RuntimeError::device("writing the slot mapping"))
    }
}
