//! Model validation, the index rule and the JSON form.

use super::*;

fn model(layers: &[LayerSpec]) -> ModelSpec<'_> {
    ModelSpec {
        name: "t",
        block_tokens: 64,
        top_k: 16,
        layers,
    }
}

#[test]
fn rejects_bad_geometry() {
    assert_eq!(model(&[]).validate(), Err(ModelError::NoLayers));
    let reg = LayerSpec::Regular(RegularLayer::full(64, 1));
    assert_eq!(model(&[reg]).validate(), Err(ModelError::NoSparseLayers));
    assert_eq!(
        model(&[LayerSpec::sparse_follower(656)]).validate(),
        Err(ModelError::FollowerWithoutLeader { layer: 0 })
    );
    assert_eq!(
        model(&[LayerSpec::sparse_leader(650, 132)]).validate(),
        Err(ModelError::RowNotAligned {
            layer: 0,
            field: "row_bytes",
            value: 650,
            multiple: 16
        })
    );
    let split = LayerSpec::Sparse(SparseLayer {
        row_bytes: 592,
        value_bytes: 584,
        compress_ratio: 1,
        indexer_row_bytes: Some(132),
        indexer_value_bytes: None,
        page_alignment: 1,
    });
    assert!(matches!(
        model(&[split]).validate(),
        Err(ModelError::RowNotAligned { layer: 0, .. })
    ));
    assert_eq!(
        model(&[
            LayerSpec::sparse_leader(656, 132),
            LayerSpec::sparse_leader(672, 132)
        ])
        .validate(),
        Err(ModelError::MixedSparseGeometry {
            layer: 1,
            field: "row_bytes",
            value: 672,
            expected: 656
        })
    );
    let odd = LayerSpec::Regular(RegularLayer::full(64, 3));
    assert!(matches!(
        model(&[LayerSpec::sparse_leader(656, 132), odd]).validate(),
        Err(ModelError::RatioDoesNotDivideBlock { layer: 1, .. })
    ));
    assert_eq!(
        model(&[LayerSpec::sparse_leader(656, 132)]).validate(),
        Ok(())
    );
}

fn split(row_bytes: u32, value_bytes: u32) -> LayerSpec {
    LayerSpec::Sparse(SparseLayer {
        row_bytes,
        value_bytes,
        compress_ratio: 1,
        indexer_row_bytes: Some(132),
        indexer_value_bytes: Some(128),
        page_alignment: 576,
    })
}

/// DeepSeek V4's fp8_ds_mla rows (576 value + 8 scale bytes) and its split 132-B indexer
/// rows are valid; a scale part that is not a multiple of 4 is not, nor an indexer value
/// part beyond its row.
#[test]
fn split_rows_need_16_byte_values_and_4_byte_scales() {
    assert_eq!(model(&[split(584, 576)]).validate(), Ok(()));
    assert_eq!(
        model(&[split(582, 576)]).validate(),
        Err(ModelError::RowNotAligned {
            layer: 0,
            field: "scale bytes (row_bytes - value_bytes)",
            value: 6,
            multiple: 4
        })
    );
    let LayerSpec::Sparse(mut s) = split(584, 576) else {
        unreachable!()
    };
    s.indexer_value_bytes = Some(133);
    assert!(matches!(
        model(&[LayerSpec::Sparse(s)]).validate(),
        Err(ModelError::IndexerValueBytes { value: 133, .. })
    ));
    s.indexer_value_bytes = None;
    s.page_alignment = 0;
    assert_eq!(
        model(&[LayerSpec::Sparse(s)]).validate(),
        Err(ModelError::ZeroField {
            layer: 0,
            field: "page_alignment"
        })
    );
    assert_eq!(padded_page_bytes(64, 584, 576), Some(37440));
    assert_eq!(padded_page_bytes(64, 132, 576), Some(8640));
    assert_eq!(padded_page_bytes(2, 584, 576), Some(1728));
    assert_eq!(padded_page_bytes(64, 656, 1), Some(41984));
}

#[test]
fn regular_blocks_divide_the_model_block() {
    let mut swa = RegularLayer::windowed(584, 128);
    swa.block_tokens = Some(16);
    let layers = [LayerSpec::sparse_leader(656, 132), LayerSpec::Regular(swa)];
    assert_eq!(model(&layers).validate(), Ok(()));
    swa.block_tokens = Some(48);
    let layers = [LayerSpec::sparse_leader(656, 132), LayerSpec::Regular(swa)];
    assert_eq!(
        model(&layers).validate(),
        Err(ModelError::RegularBlockTokens {
            layer: 1,
            block_tokens: 48,
            model_block_tokens: 64
        })
    );
    let mut c = RegularLayer::full(64, 8);
    c.block_tokens = Some(4);
    let layers = [LayerSpec::sparse_leader(656, 132), LayerSpec::Regular(c)];
    assert!(matches!(
        model(&layers).validate(),
        Err(ModelError::RatioDoesNotDivideBlock {
            layer: 1,
            compress_ratio: 8,
            block_tokens: 4
        })
    ));
}

/// GLM-5's `index_topk_freq = 4`, `index_skip_topk_offset = 3`: 21 leaders of 78, at
/// 0, 1, 2, 6, 10, …, 74; the rule is found again from the leaders.
#[test]
fn glm5_index_rule() {
    let rule = IndexRule {
        freq: 4,
        skip_offset: 3,
    };
    let leaders: std::vec::Vec<u32> = (0..78).filter(|&k| rule.leads(k)).collect();
    assert_eq!(leaders.len(), 21);
    assert_eq!(&leaders[..5], &[0, 1, 2, 6, 10]);
    assert_eq!(leaders.last(), Some(&74));
    let mut layers = [LayerSpec::sparse_leader(656, 132); 78];
    rule.apply(&mut layers, 132);
    let m = model(&layers);
    m.validate().unwrap();
    assert_eq!(m.num_leaders(), 21);
    assert_eq!(IndexRule::detect(&layers), Some(rule));
    // Every layer leading is no rule; neither is a pattern no (freq, offset) gives.
    assert_eq!(
        IndexRule::detect(&[LayerSpec::sparse_leader(656, 132); 8]),
        None
    );
    let mut odd = [LayerSpec::sparse_leader(656, 132); 8];
    odd[3] = LayerSpec::sparse_follower(656);
    odd[4] = LayerSpec::sparse_follower(656);
    odd[6] = LayerSpec::sparse_follower(656);
    assert_eq!(IndexRule::detect(&odd), None);
}
