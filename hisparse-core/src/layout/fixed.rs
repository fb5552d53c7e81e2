//! The layout in arrays, for a runtime without an allocator (firmware, a DPU): the same planner
//! as [`plan_layout`](super::plan_layout), writing into a [`FixedLayout`] whose capacities are
//! const generics.

use super::plan::{PlanSink, plan_into};
use super::{GroupKind, GroupLayer, GroupShape, LayoutError, LayoutInput, LayoutSizes};
use crate::ops::LayerPair;

/// One index group of a [`FixedLayout`]: a leader and the followers that apply its resolver
/// plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedIndexGroup {
    /// Model layer of the leader.
    pub leader: u32,
    /// Bucket (resident/hot group pair) the unit lives in.
    pub bucket: u32,
    /// Index of the leader among the model's sparse layers (the source group's layers): the
    /// unit is source layers `first..first + len`.
    pub first: u32,
    /// Sparse layers in the unit, the leader included.
    pub len: u32,
}

/// A planned layout in arrays: up to `GROUPS` KV-cache groups and `LAYERS` layer entries. A
/// sparse layer is an entry of the source group, of its bucket's resident and hot groups and,
/// for a leader, of the indexer group; a regular layer one entry of its group: `LAYERS` of
/// `4 × sparse layers + regular layers` always suffices (DeepSeek V3.2: 244). Index groups count
/// against `LAYERS` too (one per leader). `GROUPS` is `2 + 2 × buckets + regular groups`
/// (DeepSeek V3.2: 14).
///
/// Its groups, layers, index groups and sizes are those [`plan_layout`](super::plan_layout)
/// gives for the same input (one planner writes both). Size: about `64 × LAYERS + 40 ×
/// GROUPS` bytes plus the sizes; place it in a `static` or on a stack that holds it.
#[derive(Clone, Debug)]
pub struct FixedLayout<'m, const GROUPS: usize, const LAYERS: usize> {
    /// The model's name.
    pub model: &'m str,
    /// Block sizes, pool sizes and per-request counts.
    pub sizes: LayoutSizes,
    parts: FixedParts<GROUPS, LAYERS>,
}

/// The arrays a [`FixedLayout`] is planned into.
#[derive(Clone, Debug)]
struct FixedParts<const GROUPS: usize, const LAYERS: usize> {
    groups: [GroupShape; GROUPS],
    num_groups: usize,
    /// Every layer entry with the index of its group, in the order the planner placed them.
    layers: [(u32, GroupLayer); LAYERS],
    num_layers: usize,
    index_groups: [FixedIndexGroup; LAYERS],
    num_index_groups: usize,
}

const NO_GROUP: GroupShape = GroupShape {
    kind: GroupKind::Source,
    bucket: None,
    sliding_window: None,
    block_tokens: 0,
    cache: None,
    page_bytes: 0,
    num_layers: 0,
};

const NO_LAYER: GroupLayer = GroupLayer {
    layer: 0,
    index_in_group: 0,
    offset: 0,
    page_bytes: 0,
    rows_per_block: 0,
    row_bytes: 0,
    value_bytes: 0,
};

const NO_INDEX_GROUP: FixedIndexGroup = FixedIndexGroup {
    leader: 0,
    bucket: 0,
    first: 0,
    len: 0,
};

impl<const GROUPS: usize, const LAYERS: usize> FixedParts<GROUPS, LAYERS> {
    fn new() -> Self {
        FixedParts {
            groups: [NO_GROUP; GROUPS],
            num_groups: 0,
            layers: [(0, NO_LAYER); LAYERS],
            num_layers: 0,
            index_groups: [NO_INDEX_GROUP; LAYERS],
            num_index_groups: 0,
        }
    }

    fn layers_of(&self, g: usize) -> impl Iterator<Item = &GroupLayer> {
        self.layers[..self.num_layers]
            .iter()
            .filter(move |(group, _)| *group as usize == g)
            .map(|(_, l)| l)
    }
}

/// The capacity error of a full array.
fn full(what: &'static str, parameter: &'static str, capacity: usize) -> LayoutError {
    LayoutError::FixedCapacity {
        what,
        parameter,
        capacity,
    }
}

impl<const GROUPS: usize, const LAYERS: usize> PlanSink for FixedParts<GROUPS, LAYERS> {
    fn push_group(&mut self, group: GroupShape) -> Result<usize, LayoutError> {
        let slot = self
            .groups
            .get_mut(self.num_groups)
            .ok_or(full("groups", "GROUPS", GROUPS))?;
        *slot = group;
        self.num_groups += 1;
        Ok(self.num_groups - 1)
    }

    fn num_groups(&self) -> usize {
        self.num_groups
    }

    fn group(&self, g: usize) -> (GroupShape, Option<GroupLayer>) {
        (self.groups[g], self.layers_of(g).next().copied())
    }

    fn push_layer(&mut self, g: usize, layer: GroupLayer) -> Result<(), LayoutError> {
        let slot =
            self.layers
                .get_mut(self.num_layers)
                .ok_or(full("layer entries", "LAYERS", LAYERS))?;
        *slot = (g as u32, layer);
        self.num_layers += 1;
        self.groups[g].num_layers += 1;
        Ok(())
    }

    fn set_page_bytes(&mut self, g: usize, bytes: u64) {
        self.groups[g].page_bytes = bytes;
    }

    fn push_index_group(
        &mut self,
        leader: u32,
        bucket: u32,
        first: u32,
        len: u32,
    ) -> Result<(), LayoutError> {
        let slot = self
            .index_groups
            .get_mut(self.num_index_groups)
            .ok_or(full("index groups", "LAYERS", LAYERS))?;
        *slot = FixedIndexGroup {
            leader,
            bucket,
            first,
            len,
        };
        self.num_index_groups += 1;
        Ok(())
    }

    fn index_bucket(&self, i: usize) -> u32 {
        self.index_groups[i].bucket
    }

    fn place_source_arrays(&mut self, array_bytes: u64) {
        for (group, l) in &mut self.layers[..self.num_layers] {
            if *group == 0 {
                l.offset = u64::from(l.index_in_group) * array_bytes;
            }
        }
    }
}

/// Plans the layout into arrays (no allocator): the same rules, errors and result as
/// [`plan_layout`](super::plan_layout), plus [`LayoutError::FixedCapacity`] when the model needs
/// more than `GROUPS` groups or `LAYERS` layer entries.
///
/// ```
/// use hisparse_core::{config::HiSparseConfig, layout::{plan_layout_fixed, LayoutInput}, presets};
/// let model = presets::DEEPSEEK_V32;
/// let cfg = HiSparseConfig::new(model.top_k, 64 << 30);
/// let input = LayoutInput::new(&model, &cfg, 40 << 30, 131072);
/// let kv = plan_layout_fixed::<16, 256>(&input).unwrap();
/// assert_eq!(kv.sizes.num_buckets, 6);
/// assert_eq!(kv.sizes.bytes_per_block, 545792);
/// assert_eq!(kv.groups().len(), 14);
/// assert_eq!(kv.layers(0).count(), 61);
/// ```
pub fn plan_layout_fixed<'m, const GROUPS: usize, const LAYERS: usize>(
    input: &LayoutInput<'m>,
) -> Result<FixedLayout<'m, GROUPS, LAYERS>, LayoutError> {
    let mut parts = FixedParts::new();
    let sizes = plan_into(input, &mut parts)?;
    Ok(FixedLayout {
        model: input.model.name,
        sizes,
        parts,
    })
}

impl<const GROUPS: usize, const LAYERS: usize> FixedLayout<'_, GROUPS, LAYERS> {
    /// The groups, in order `[source, indexer, resident.., hot.., regular..]`.
    pub fn groups(&self) -> &[GroupShape] {
        &self.parts.groups[..self.parts.num_groups]
    }

    /// The layers of group `group` in order (none for a group that does not exist).
    pub fn layers(&self, group: usize) -> impl Iterator<Item = &GroupLayer> {
        self.parts.layers_of(group)
    }

    /// The index groups (leader + followers) in model order.
    pub fn index_groups(&self) -> &[FixedIndexGroup] {
        &self.parts.index_groups[..self.parts.num_index_groups]
    }

    /// The model layers of index group `index_group` (leader first; none for an index group
    /// that does not exist).
    pub fn index_group_layers(&self, index_group: usize) -> impl Iterator<Item = u32> + '_ {
        let (first, len) = self
            .index_groups()
            .get(index_group)
            .map_or((0, 0), |g| (g.first as usize, g.len as usize));
        self.layers(0).skip(first).take(len).map(|l| l.layer)
    }

    /// Host and device layouts of sparse model layer `layer`, as
    /// [`KvCacheConfig::layer_pair`](super::KvCacheConfig::layer_pair) gives them;
    /// [`LayoutError::NotSparse`] for a layer that is not sparse.
    pub fn layer_pair(&self, layer: u32) -> Result<LayerPair, LayoutError> {
        let placed = |kind: GroupKind| {
            let groups = self.groups().iter().enumerate();
            let mut of_kind = groups.filter(move |(_, g)| g.kind == kind);
            of_kind.find_map(|(g, _)| self.layers(g).find(|l| l.layer == layer))
        };
        match (placed(GroupKind::Source), placed(GroupKind::Resident)) {
            (Some(source), Some(resident)) => self.sizes.layer_pair(source, resident),
            _ => Err(LayoutError::NotSparse { layer }),
        }
    }
}

#[cfg(test)]
#[path = "fixed_tests.rs"]
mod tests;
