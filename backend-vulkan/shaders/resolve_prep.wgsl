// Resolve, pass 1: groups token rows by request. For a valid row t of request r:
// start = valid rows of requests < r, count = rows of r, rank = rows of r before t.
// info[4t..4t+4] = (start + rank, start, count, rank); perm[start + rank] = t, so each request's
// rows (in row order) occupy perm[start..start + count]. Padding rows get rank = 0xffffffff.
struct Params {
    num_tokens: u32,
    num_requests: u32,
}

//@read req_id: array<i32>
//@read_write info: array<u32>
//@read_write perm: array<u32>

// Items: one per token row (the entry point: per_item.wgsl).
fn items() -> u32 {
    return pc.num_tokens;
}

fn item(t: u32) {
    let req = req_id[t];
    if (req < 0 || u32(req) >= pc.num_requests) {
        info[4u * t] = 0xffffffffu;
        info[4u * t + 1u] = 0u;
        info[4u * t + 2u] = 0u;
        info[4u * t + 3u] = 0xffffffffu;
        return;
    }
    var start = 0u;
    var count = 0u;
    var rank = 0u;
    for (var i = 0u; i < pc.num_tokens; i = i + 1u) {
        let o = req_id[i];
        if (o < 0 || u32(o) >= pc.num_requests) {
            continue;
        }
        if (o < req) {
            start = start + 1u;
        } else if (o == req) {
            count = count + 1u;
            if (i < t) {
                rank = rank + 1u;
            }
        }
    }
    info[4u * t] = start + rank;
    info[4u * t + 1u] = start;
    info[4u * t + 2u] = count;
    info[4u * t + 3u] = rank;
    perm[start + rank] = t;
}
