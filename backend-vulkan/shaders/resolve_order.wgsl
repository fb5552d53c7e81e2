// Resolve in batch-row order, pass 0: the owning batch row of every token row (hisparse_core's
// resolve module, "Table row order"). eff[t] = req_id[t] when it is a batch row b < num_requests
// whose state row s = idx_mapping[b] lies in 0..num_state_rows and no batch row before b maps to
// s (the smallest batch row owns a state row); else -1, so the grouping pass and the resolvers,
// which read eff in place of req_id, treat the row as padding.
struct Params {
    num_tokens: u32,
    num_requests: u32,
    num_state_rows: u32,
}

//@read req_id: array<i32>
//@read idx_mapping: array<i32>
//@read_write eff: array<i32>

// Items: one per token row (the entry point: per_item.wgsl).
fn items() -> u32 {
    return pc.num_tokens;
}

fn item(t: u32) {
    let b = req_id[t];
    var owner = b;
    if (b < 0 || u32(b) >= pc.num_requests) {
        owner = -1;
    } else {
        let s = idx_mapping[b];
        if (s < 0 || u32(s) >= pc.num_state_rows) {
            owner = -1;
        } else {
            for (var i = 0u; i < u32(b); i = i + 1u) {
                if (idx_mapping[i] == s) {
                    owner = -1;
                    break;
                }
            }
        }
    }
    eff[t] = owner;
}
