#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod admission;
mod command;
mod coordinator;
mod error;
mod exclusive;
mod layout;
mod report;
mod runtime;
mod scheduling;
mod views;

pub use admission::{
    HsAdmission, HsNeeds, HsTierFree, hs_coordinator_can_schedule, hs_coordinator_can_start,
    hs_coordinator_needs, hs_coordinator_tier_free,
};
pub use command::{
    HsCommand, HsCommandInfo, HsRefusal, HsRefusedRequest, HsScheduledRequest, hs_command_free,
    hs_command_info, hs_command_preempted, hs_command_refused, hs_command_scheduled,
};
pub use coordinator::{
    HsCoordinator, HsCoordinatorConfig, HsPoolUsage, hs_coordinator_admit,
    hs_coordinator_append_token_by_slot, hs_coordinator_append_tokens,
    hs_coordinator_block_table_row, hs_coordinator_check_drained, hs_coordinator_check_invariants,
    hs_coordinator_config_default, hs_coordinator_finish, hs_coordinator_free,
    hs_coordinator_hot_row, hs_coordinator_is_empty, hs_coordinator_new,
    hs_coordinator_num_computed, hs_coordinator_num_running, hs_coordinator_num_tokens,
    hs_coordinator_num_waiting, hs_coordinator_pool_usage, hs_coordinator_preempt,
    hs_coordinator_refusal, hs_coordinator_report, hs_coordinator_running_ids,
    hs_coordinator_slot_of,
};
pub use error::{HsStatus, hs_last_error, hs_status_name};
pub use layout::{
    HsIndexGroupInfo, HsLayout, HsLayoutInfo, HsLayoutOptions, hs_layout_free,
    hs_layout_host_layer_offset, hs_layout_index_group, hs_layout_index_group_layer,
    hs_layout_info, hs_layout_layer_offset, hs_layout_options_default, hs_layout_plan,
};
pub use report::{
    HsReport, HsReportInfo, hs_coordinator_apply_report, hs_report_completed, hs_report_enqueued,
    hs_report_free, hs_report_info, hs_runtime_drain_report, hs_runtime_poll,
};
pub use runtime::{
    HsBuffer, HsCounters, HsDeviceArray, HsLayerCall, HsLentResources, HsRemapModes, HsRuntime,
    HsRuntimeConfig, HsSwap, hs_buffer_alloc, hs_buffer_download_i32, hs_buffer_free,
    hs_buffer_lend, hs_buffer_upload_i32, hs_runtime_apply_plan, hs_runtime_batch_table,
    hs_runtime_begin_step, hs_runtime_block_table, hs_runtime_compressed_slot_mapping,
    hs_runtime_config_default, hs_runtime_counters, hs_runtime_decode, hs_runtime_drain,
    hs_runtime_end_step, hs_runtime_free, hs_runtime_host_pool_setup, hs_runtime_new,
    hs_runtime_new_with_pools, hs_runtime_poll_and_report, hs_runtime_read_block_table,
    hs_runtime_read_device_pool, hs_runtime_read_host_pool, hs_runtime_read_slot_mapping,
    hs_runtime_remap_modes, hs_runtime_remap_prefill, hs_runtime_resident_row,
    hs_runtime_resolve_index_group, hs_runtime_resolve_leader, hs_runtime_set_batch,
    hs_runtime_slot_mapping, hs_runtime_slot_mapping_groups, hs_runtime_synchronize,
    hs_runtime_write_device_pool,
};
pub use scheduling::{
    HsAlloc, HsStepSummary, hs_coordinator_build_offload_command, hs_coordinator_complete_import,
    hs_coordinator_import_blocks, hs_coordinator_reserve_import, hs_coordinator_rollback,
    hs_coordinator_schedule, hs_coordinator_schedule_step, hs_coordinator_start,
    hs_coordinator_step,
};
pub use views::{HsGroupInfo, HsGroupKind, HsLayerView, hs_layout_group, hs_layout_layer_view};
