//! The per-request tables the decode path reads, kept on the device and updated incrementally.
//!
//! Each table is one `i32[state_rows][width]` device buffer with a host shadow of what the device
//! holds. A command's updates change the shadow; only entries whose value changed are written,
//! with one [`Device::write_table`] call per table that changed (stream-ordered, no upload of
//! whole tables).

use hisparse_core::Device;
use hisparse_core::coordinator::{OffloadCommand, TableUpdate};
use hisparse_core::layout::{GroupKind, KvCacheConfig};
use hisparse_core::ops::{TableWrite, TableWriteDesc};

use crate::error::RuntimeError;

/// One device table and its shadow.
pub(crate) struct Table<D: Device> {
    pub(crate) buf: D::Buffer,
    shadow: Vec<i32>,
    width: u32,
    /// The value of an entry nobody set (a fresh row): `0` (null block) or `-1` (no host block,
    /// no hot block).
    empty: i32,
    touched: Vec<u32>,
    writes: Vec<TableWrite>,
}

impl<D: Device> Table<D> {
    fn new(dev: &D, rows: u32, width: u32, empty: i32) -> Result<Self, RuntimeError<D::Error>> {
        let len = rows as usize * width as usize;
        let shadow = vec![empty; len];
        let mut buf = dev
            .alloc(len.max(1) * 4)
            .map_err(RuntimeError::device("allocating a table"))?;
        if empty != 0 {
            dev.upload_i32(&mut buf, 0, &shadow)
                .map_err(RuntimeError::device("initialising a table"))?;
        }
        Ok(Table {
            buf,
            shadow,
            width,
            empty,
            touched: Vec::new(),
            writes: Vec::new(),
        })
    }

    /// Sets entry `(row, col)`; ignores columns beyond the table (the caller checked rows).
    fn set(&mut self, row: u32, col: u32, value: i32) -> bool {
        if col >= self.width {
            return false;
        }
        let i = row * self.width + col;
        let e = &mut self.shadow[i as usize];
        if *e != value {
            *e = value;
            self.touched.push(i);
        }
        true
    }

    /// Puts row `row` back to the empty value.
    fn clear_row(&mut self, row: u32) {
        for col in 0..self.width {
            self.set(row, col, self.empty);
        }
    }

    /// The shadow's row `row` (what the device will hold after [`Table::flush`]).
    pub(crate) fn row(&self, row: u32) -> &[i32] {
        let w = self.width as usize;
        &self.shadow[row as usize * w..(row as usize + 1) * w]
    }

    /// Writes the changed entries to the device; returns how many.
    fn flush(&mut self, dev: &D, stream: &D::Stream) -> Result<usize, RuntimeError<D::Error>> {
        if self.touched.is_empty() {
            return Ok(0);
        }
        self.touched.sort_unstable();
        self.touched.dedup();
        self.writes.clear();
        self.writes
            .extend(self.touched.iter().map(|&index| TableWrite {
                index,
                value: self.shadow[index as usize],
            }));
        self.touched.clear();
        let desc = TableWriteDesc {
            table_len: self.shadow.len() as u32,
        };
        dev.write_table(stream, &desc, &self.writes, &mut self.buf)
            .map_err(RuntimeError::device("writing table updates"))?;
        Ok(self.writes.len())
    }
}

/// Every per-request table of the layout.
pub(crate) struct Tables<D: Device> {
    /// Source group: page → host block (`-1` = none).
    pub(crate) host: Table<D>,
    /// Indexer group: page → GPU block (`0` = none).
    pub(crate) indexer: Table<D>,
    /// Per bucket: page → resident GPU block (`0` = read from host).
    pub(crate) resident: Vec<Table<D>>,
    /// Per bucket: the hot region's GPU blocks (`-1` = none).
    pub(crate) hot: Vec<Table<D>>,
    /// Per regular group: page → GPU block (`0` = none).
    pub(crate) regular: Vec<Table<D>>,
    rows: u32,
    /// First regular group index in the layout.
    regular_start: usize,
    num_buckets: u32,
}

impl<D: Device> Tables<D> {
    /// Tables for `rows` state rows; `hot_width` is the resolver's hot-table width.
    pub(crate) fn new(
        dev: &D,
        kv: &KvCacheConfig,
        rows: u32,
        hot_width: u32,
    ) -> Result<Self, RuntimeError<D::Error>> {
        let m = kv.max_pages_per_request;
        let b = kv.num_buckets;
        Ok(Tables {
            host: Table::new(dev, rows, m, -1)?,
            indexer: Table::new(dev, rows, m, 0)?,
            resident: (0..b)
                .map(|_| Table::new(dev, rows, m, 0))
                .collect::<Result<_, _>>()?,
            hot: (0..b)
                .map(|_| Table::new(dev, rows, hot_width, -1))
                .collect::<Result<_, _>>()?,
            regular: kv
                .regular_groups()
                .map(|_| Table::new(dev, rows, m, 0))
                .collect::<Result<_, _>>()?,
            rows,
            regular_start: kv.regular_groups().start,
            num_buckets: b,
        })
    }

    /// Device bytes `rows` state rows of tables take for `kv` (for the budget check).
    pub(crate) fn bytes(kv: &KvCacheConfig, rows: u32, hot_width: u32) -> u64 {
        let m = u64::from(kv.max_pages_per_request);
        let tables = 2 + u64::from(kv.num_buckets) + kv.regular_groups().len() as u64;
        u64::from(rows) * 4 * (tables * m + u64::from(kv.num_buckets) * u64::from(hot_width))
    }

    fn check_row(&self, row: u32) -> Result<(), RuntimeError<D::Error>> {
        if row >= self.rows {
            return Err(RuntimeError::StateRow {
                row,
                rows: self.rows,
            });
        }
        Ok(())
    }

    /// The table of layout group `group` for a [`TableUpdate`].
    fn table_of(&mut self, group: u32) -> Result<&mut Table<D>, RuntimeError<D::Error>> {
        let g = group as usize;
        let b = self.num_buckets as usize;
        let bad = || RuntimeError::Command(format!("a table update names group {group}"));
        match g {
            0 => Ok(&mut self.host),
            1 => Ok(&mut self.indexer),
            _ if g < 2 + b => Ok(&mut self.resident[g - 2]),
            _ if g < 2 + 2 * b => Ok(&mut self.hot[g - 2 - b]),
            _ => self.regular.get_mut(g - self.regular_start).ok_or_else(bad),
        }
    }

    fn apply(&mut self, u: &TableUpdate, kind: GroupKind) -> Result<(), RuntimeError<D::Error>> {
        self.check_row(u.slot)?;
        let value = i32::try_from(u.block)
            .map_err(|_| RuntimeError::Command(format!("block {} does not fit i32", u.block)))?;
        // Block 0 is the null block: "none" in the host table is -1.
        let value = if kind == GroupKind::Source && value == 0 {
            -1
        } else {
            value
        };
        let t = self.table_of(u.group)?;
        if !t.set(u.slot, u.page, value) {
            return Err(RuntimeError::Command(format!(
                "page {} of state row {} is beyond the table's {} columns",
                u.page, u.slot, t.width
            )));
        }
        Ok(())
    }

    /// Applies a command's table changes to the shadows, in the command's documented order:
    /// started rows reset, released hot regions cleared, then host, residency, block-table and
    /// hot-region updates.
    pub(crate) fn apply_command(
        &mut self,
        kv: &KvCacheConfig,
        cmd: &OffloadCommand,
    ) -> Result<(), RuntimeError<D::Error>> {
        for &row in &cmd.started {
            self.check_row(row)?;
            self.host.clear_row(row);
            self.indexer.clear_row(row);
            for t in self
                .resident
                .iter_mut()
                .chain(self.hot.iter_mut())
                .chain(self.regular.iter_mut())
            {
                t.clear_row(row);
            }
        }
        for &row in &cmd.hot_release {
            self.check_row(row)?;
            for t in &mut self.hot {
                t.clear_row(row);
            }
        }
        for u in cmd
            .host_blocks
            .iter()
            .chain(&cmd.residency)
            .chain(&cmd.block_tables)
        {
            let kind = kv
                .groups
                .get(u.group as usize)
                .map(|g| g.kind)
                .ok_or_else(|| RuntimeError::Command(format!("no group {}", u.group)))?;
            self.apply(u, kind)?;
        }
        for a in &cmd.hot_assign {
            self.check_row(a.slot)?;
            let b = (a.group as usize)
                .checked_sub(2 + self.num_buckets as usize)
                .filter(|&b| b < self.num_buckets as usize)
                .ok_or_else(|| {
                    RuntimeError::Command(format!("hot region for group {}", a.group))
                })?;
            let t = &mut self.hot[b];
            if a.blocks.len() > t.width as usize {
                return Err(RuntimeError::Command(format!(
                    "hot region of {} blocks for a {}-block hot table",
                    a.blocks.len(),
                    t.width
                )));
            }
            for col in 0..t.width {
                let v = a.blocks.get(col as usize).map_or(-1, |&x| x as i32);
                t.set(a.slot, col, v);
            }
        }
        Ok(())
    }

    /// Writes every table's changes on `stream`; returns the number of entries written.
    pub(crate) fn flush(
        &mut self,
        dev: &D,
        stream: &D::Stream,
    ) -> Result<usize, RuntimeError<D::Error>> {
        let mut n = self.host.flush(dev, stream)? + self.indexer.flush(dev, stream)?;
        for t in self
            .resident
            .iter_mut()
            .chain(self.hot.iter_mut())
            .chain(self.regular.iter_mut())
        {
            n += t.flush(dev, stream)?;
        }
        Ok(n)
    }
}
