//! The per-request tables the decode path reads, kept on the device and updated incrementally.
//!
//! Each table is one `i32[state_rows][width]` device buffer with a host shadow of what the device
//! holds. A command's updates change the shadow; only entries whose value changed are written,
//! with one [`Device::write_table`] call per table that changed (stream-ordered, no upload of
//! whole tables).

use hisparse_core::Device;
use hisparse_core::coordinator::OffloadCommand;
use hisparse_core::layout::KvCacheConfig;
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

    /// Sets entry `(row, col)` (both checked by the caller).
    fn set(&mut self, row: u32, col: u32, value: i32) {
        let i = row * self.width + col;
        let e = &mut self.shadow[i as usize];
        if *e != value {
            *e = value;
            self.touched.push(i);
        }
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
            // A regular group's table has a column per block of its own size.
            regular: kv
                .regular_groups()
                .map(|g| Table::new(dev, rows, kv.table_width(g), 0))
                .collect::<Result<_, _>>()?,
            rows,
            regular_start: kv.regular_groups().start,
            num_buckets: b,
        })
    }

    /// Device bytes `rows` state rows of tables take for `kv` (for the budget check).
    pub(crate) fn bytes(kv: &KvCacheConfig, rows: u32, hot_width: u32) -> u64 {
        let m = u64::from(kv.max_pages_per_request);
        let tables = 2 + u64::from(kv.num_buckets);
        let regular: u64 = kv
            .regular_groups()
            .map(|g| u64::from(kv.table_width(g)))
            .sum();
        u64::from(rows)
            * 4
            * (tables * m + regular + u64::from(kv.num_buckets) * u64::from(hot_width))
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

    /// The width of layout group `group`'s table and whether it is the host table (whose
    /// "none" is `-1`), or `None` for a group without a per-request table.
    fn shape_of(&self, group: u32) -> Option<(u32, bool)> {
        let g = group as usize;
        let b = self.num_buckets as usize;
        match g {
            0 => Some((self.host.width, true)),
            1 => Some((self.indexer.width, false)),
            _ if g < 2 + b => Some((self.resident[g - 2].width, false)),
            _ if g < 2 + 2 * b => Some((self.hot[g - 2 - b].width, false)),
            _ => g
                .checked_sub(self.regular_start)
                .and_then(|i| self.regular.get(i))
                .map(|t| (t.width, false)),
        }
    }

    /// The shadow row of state row `row` in layout group `group`'s table (what the device holds
    /// once the tables are flushed), or `None` for a group without a table or a row outside.
    pub(crate) fn group_row(&self, group: usize, row: u32) -> Option<&[i32]> {
        let b = self.num_buckets as usize;
        if row >= self.rows {
            return None;
        }
        let table = match group {
            0 => &self.host,
            1 => &self.indexer,
            _ if group < 2 + b => &self.resident[group - 2],
            _ if group < 2 + 2 * b => &self.hot[group - 2 - b],
            _ => self.regular.get(group.checked_sub(self.regular_start)?)?,
        };
        Some(table.row(row))
    }

    /// The table of layout group `group` (one [`Tables::shape_of`] accepted).
    fn table_of(&mut self, group: u32) -> &mut Table<D> {
        let g = group as usize;
        let b = self.num_buckets as usize;
        match g {
            0 => &mut self.host,
            1 => &mut self.indexer,
            _ if g < 2 + b => &mut self.resident[g - 2],
            _ if g < 2 + 2 * b => &mut self.hot[g - 2 - b],
            _ => &mut self.regular[g - self.regular_start],
        }
    }

    /// Checks every table change of `cmd`, so that applying it cannot fail half-way: a refused
    /// command leaves the tables as they were.
    pub(crate) fn validate(&self, cmd: &OffloadCommand) -> Result<(), RuntimeError<D::Error>> {
        for &row in cmd.started.iter().chain(&cmd.hot_release) {
            self.check_row(row)?;
        }
        for u in cmd
            .host_blocks
            .iter()
            .chain(&cmd.residency)
            .chain(&cmd.block_tables)
        {
            self.check_row(u.slot)?;
            let (width, _) = self.shape_of(u.group).ok_or_else(|| {
                RuntimeError::Command(format!("a table update names group {}", u.group))
            })?;
            if u.page >= width {
                return Err(RuntimeError::Command(format!(
                    "page {} of state row {} is beyond the table's {width} columns",
                    u.page, u.slot
                )));
            }
            if i32::try_from(u.block).is_err() {
                return Err(RuntimeError::Command(format!(
                    "block {} does not fit i32",
                    u.block
                )));
            }
        }
        let b = self.num_buckets as usize;
        for a in &cmd.hot_assign {
            self.check_row(a.slot)?;
            let bucket = (a.group as usize)
                .checked_sub(2 + b)
                .filter(|&i| i < b)
                .ok_or_else(|| {
                    RuntimeError::Command(format!("a hot region for group {}", a.group))
                })?;
            let width = self.hot[bucket].width as usize;
            if a.blocks.len() > width || a.blocks.iter().any(|&x| i32::try_from(x).is_err()) {
                return Err(RuntimeError::Command(format!(
                    "a hot region of {} blocks for a {width}-block hot table",
                    a.blocks.len()
                )));
            }
        }
        Ok(())
    }

    /// Applies a command's table changes to the shadows, in the command's documented order:
    /// started rows reset, released hot regions cleared, then host, residency, block-table and
    /// hot-region updates. [`Tables::validate`] accepted `cmd`.
    pub(crate) fn apply_command(&mut self, cmd: &OffloadCommand) {
        for &row in &cmd.started {
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
            let host = self.shape_of(u.group).is_some_and(|(_, h)| h);
            // Block 0 is the null block: "none" in the host table is -1.
            let value = match u.block as i32 {
                0 if host => -1,
                v => v,
            };
            self.table_of(u.group).set(u.slot, u.page, value);
        }
        let b = self.num_buckets as usize;
        for a in &cmd.hot_assign {
            let t = &mut self.hot[a.group as usize - 2 - b];
            for col in 0..t.width {
                let v = a.blocks.get(col as usize).map_or(-1, |&x| x as i32);
                t.set(a.slot, col, v);
            }
        }
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
