//! Commands, layouts and models are plain data: they survive a JSON round trip unchanged (run
//! with `--features serde`).
#![cfg(feature = "serde")]

use hisparse_core::config::HiSparseConfig;
use hisparse_core::coordinator::{Coordinator, CoordinatorConfig, OffloadCommand};
use hisparse_core::layout::{KvCacheConfig, LayoutInput, plan_layout};
use hisparse_core::model::OwnedModel;
use hisparse_core::presets::{DEEPSEEK_V4, GLM5};

#[test]
fn json_round_trips() {
    let cfg = HiSparseConfig::new(GLM5.top_k, 64 << 30);
    let kv = plan_layout(&LayoutInput::new(&GLM5, &cfg, 40 << 30, 65536)).unwrap();
    let json = serde_json::to_string(&kv).unwrap();
    assert_eq!(serde_json::from_str::<KvCacheConfig>(&json).unwrap(), kv);

    let model = OwnedModel::from(DEEPSEEK_V4);
    let json = serde_json::to_string(&model).unwrap();
    let back: OwnedModel = serde_json::from_str(&json).unwrap();
    assert_eq!(back, model);
    back.as_spec().validate().unwrap();

    let mut c = Coordinator::new(kv, CoordinatorConfig::default()).unwrap();
    c.admit(1, &(0..300).collect::<Vec<u32>>()).unwrap();
    let cmd = c.step().unwrap();
    assert!(!cmd.row_mirrors.is_empty());
    let json = serde_json::to_string(&cmd).unwrap();
    assert_eq!(serde_json::from_str::<OffloadCommand>(&json).unwrap(), cmd);
}
