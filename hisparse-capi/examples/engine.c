/* An engine that keeps its own scheduler, driving HiSparse through the C ABI on the CPU backend.
 *
 * Each step the engine picks its batch itself — running requests first (oldest first), then
 * waiting ones in arrival order, within a token budget — with hs_coordinator_schedule and
 * hs_coordinator_start. When the pool is short it preempts a request of its own choosing (the
 * running request with the most tokens still to compute) and retries; when reclamation is in
 * flight it waits a step. hs_coordinator_build_offload_command ends the step. The forward pass
 * writes each computed token's KV row of every layer at the row the device slot mapping gives
 * (hs_runtime_slot_mapping; on the CPU backend its address is host memory, on a GPU the engine's
 * kernels read it), and every row attention reads through the indices the runtime returns is
 * compared, byte for byte, with what was written. The GPU pool is tight, so pages are reclaimed,
 * rows swapped in from the host pool and requests preempted. Every other decode step cuts each
 * per-layer call into two micro-batch calls, each over its own token rows and state rows (what
 * an engine does to overlap one micro-batch's swap-in with other work; docs/contract.md,
 * section 7).
 *
 * The scenario runs three times: on pools the runtime allocates, on pools this program allocates
 * and lends (hs_runtime_new_with_pools) — both must give the same counters — and once more with
 * the coordinator's built-in policy (hs_coordinator_step) instead of the engine's. Exits 0 only
 * if every row matches and the counters show the pressure.
 *
 *   cargo build -p hisparse-capi
 *   cc -std=c11 -Wall -Wextra -Werror -I hisparse-capi/include hisparse-capi/examples/engine.c \
 *      target/debug/libhisparse_capi.a -lpthread -ldl -lm -o engine && ./engine
 *
 * `./engine cuda` runs it on a GPU (build the library with `--features cuda`).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hisparse.h"

#define LAYERS 3
#define ROW_BYTES 64
#define BLOCK 16
#define TOP_K 16
#define REQUESTS 4
#define PROMPT 90
#define DECODE 30
#define BUDGET 128 /* tokens one step may compute */

#define CHECK(call)                                                                          \
    do {                                                                                     \
        HsStatus status_ = (call);                                                           \
        if (status_ != HS_STATUS_OK) {                                                       \
            fprintf(stderr, "engine.c:%d: %s failed: %s: %s\n", __LINE__, #call,              \
                    hs_status_name(status_), hs_last_error());                               \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "engine.c:%d: ", __LINE__);                                      \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* The bytes the forward pass writes for (request, token, layer). */
static void make_row(uint64_t req, uint32_t pos, uint32_t layer, uint8_t *out) {
    for (uint32_t i = 0; i < ROW_BYTES; i++) {
        out[i] = (uint8_t)((req * 131 + pos * 7 + layer * 31 + i * 3) % 251);
    }
}

/* Byte offset in the device pool of row `row` of a layer's view. */
static uint64_t row_offset(const HsLayerView *v, uint64_t row) {
    return v->offset + (row / v->rows_per_page) * v->page_stride +
           (row % v->rows_per_page) * v->value_bytes;
}

/* Bad calls answer a status and a message, never a crash. */
static void check_errors(void) {
    HsLayoutInfo info;
    HsStatus s = hs_layout_info(NULL, &info);
    EXPECT(s == HS_STATUS_NULL_ARGUMENT, "a NULL layout gave %s", hs_status_name(s));
    EXPECT(strstr(hs_last_error(), "layout") != NULL, "message: %s", hs_last_error());

    HsLayoutOptions o;
    CHECK(hs_layout_options_default(&o));
    o.preset = "no-such-model";
    HsLayout *layout = NULL;
    s = hs_layout_plan(&o, &layout);
    EXPECT(s == HS_STATUS_INVALID_ARGUMENT && layout == NULL, "an unknown preset gave %s",
           hs_status_name(s));
    EXPECT(strstr(hs_last_error(), "unknown preset") != NULL, "message: %s", hs_last_error());

    CHECK(hs_layout_options_default(&o));
    CHECK(hs_layout_plan(&o, &layout));
    HsRuntimeConfig rc;
    CHECK(hs_runtime_config_default(&rc));
    HsRuntime *rt = NULL;
    s = hs_runtime_new(layout, "tpu", "", &rc, &rt);
    EXPECT(s == HS_STATUS_INVALID_ARGUMENT && rt == NULL, "backend tpu gave %s",
           hs_status_name(s));
    EXPECT(strstr(hs_last_error(), "unknown backend") != NULL, "message: %s", hs_last_error());

    HsCoordinatorConfig cc;
    CHECK(hs_coordinator_config_default(&cc));
    HsCoordinator *coord = NULL;
    CHECK(hs_coordinator_new(layout, &cc, &coord));
    s = hs_coordinator_start(coord, 1, 8, NULL);
    EXPECT(s == HS_STATUS_NULL_ARGUMENT, "a NULL outcome gave %s", hs_status_name(s));
    uint32_t prompt[3] = {1, 2, 3};
    CHECK(hs_coordinator_admit(coord, 1, prompt, 3));
    CHECK(hs_coordinator_admit(coord, 2, prompt, 3));
    size_t count = 0;
    uint64_t ids[1];
    HsAlloc a;
    CHECK(hs_coordinator_start(coord, 1, 8, &a));
    CHECK(hs_coordinator_start(coord, 2, 8, &a));
    s = hs_coordinator_running_ids(coord, ids, 1, &count);
    EXPECT(s == HS_STATUS_BUFFER_TOO_SMALL && count == 2, "a small array gave %s, count %zu",
           hs_status_name(s), count);
    hs_coordinator_free(coord);
    hs_layout_free(layout);
}

/* The engine's scheduler: its own queues, in arrival order. */
typedef struct Engine {
    HsCoordinator *coord;
    uint64_t waiting[REQUESTS];
    size_t num_waiting;
    uint64_t running[REQUESTS];
    size_t num_running;
    uint64_t preemptions, waits;
} Engine;

static uint32_t tokens_left(const Engine *e, uint64_t id) {
    uint32_t n, computed;
    CHECK(hs_coordinator_num_tokens(e->coord, id, &n));
    CHECK(hs_coordinator_num_computed(e->coord, id, &computed));
    return n - computed;
}

/* Drops request `id` from the engine's queues. */
static void forget(Engine *e, uint64_t id) {
    for (size_t i = 0; i < e->num_running; i++) {
        if (e->running[i] != id) continue;
        memmove(&e->running[i], &e->running[i + 1], (e->num_running - i - 1) * sizeof(uint64_t));
        e->num_running--;
        return;
    }
    for (size_t i = 0; i < e->num_waiting; i++) {
        if (e->waiting[i] != id) continue;
        memmove(&e->waiting[i], &e->waiting[i + 1], (e->num_waiting - i - 1) * sizeof(uint64_t));
        e->num_waiting--;
        return;
    }
}

/* Preempts the running request with the most tokens still to compute (the engine's choice),
 * queues it first among the waiting ones, and returns the index it had among the running. */
static size_t preempt_one(Engine *e) {
    size_t victim = 0;
    for (size_t i = 1; i < e->num_running; i++) {
        if (tokens_left(e, e->running[i]) > tokens_left(e, e->running[victim])) victim = i;
    }
    uint64_t id = e->running[victim];
    CHECK(hs_coordinator_preempt(e->coord, id));
    forget(e, id);
    memmove(&e->waiting[1], &e->waiting[0], e->num_waiting * sizeof(uint64_t));
    e->waiting[0] = id;
    e->num_waiting++;
    e->preemptions++;
    return victim;
}

/* Picks this step's batch and returns its command. */
static HsCommand *schedule_step(Engine *e) {
    uint32_t budget = BUDGET;
    int pressed = 0;
    for (size_t i = 0; i < e->num_running && budget > 0;) {
        uint64_t id = e->running[i];
        uint32_t want = tokens_left(e, id);
        if (want > budget) want = budget;
        if (want == 0) {
            i++;
            continue;
        }
        HsAlloc outcome;
        CHECK(hs_coordinator_schedule(e->coord, id, want, &outcome));
        if (outcome == HS_ALLOC_SCHEDULED) {
            budget -= want;
            i++;
        } else if (outcome == HS_ALLOC_WAIT) {
            e->waits++;
            pressed = 1;
            i++;
        } else {
            /* No space: make some, then ask for running[i] again (the next request, if the
             * victim was this one). */
            pressed = 1;
            if (preempt_one(e) < i) i--;
        }
    }
    /* Start waiting requests, never in a step where memory was short. */
    while (!pressed && budget > 0 && e->num_waiting > 0 && e->num_running < REQUESTS) {
        uint64_t id = e->waiting[0];
        /* Ask first: the answer, and the chunk's tokens, are what the start then does. */
        HsAdmission ask;
        CHECK(hs_coordinator_can_start(e->coord, id, budget, &ask));
        if (ask.outcome != HS_ALLOC_SCHEDULED) break;
        HsAlloc outcome;
        CHECK(hs_coordinator_start(e->coord, id, budget, &outcome));
        EXPECT(outcome == HS_ALLOC_SCHEDULED, "the start answered otherwise than its query");
        memmove(&e->waiting[0], &e->waiting[1], (e->num_waiting - 1) * sizeof(uint64_t));
        e->num_waiting--;
        e->running[e->num_running++] = id;
        budget -= ask.tokens;
    }
    HsCommand *cmd = NULL;
    CHECK(hs_coordinator_build_offload_command(e->coord, &cmd));
    return cmd;
}

/* What one run saw. */
typedef struct Outcome {
    HsCounters counters;
    uint64_t verified, steps, preemptions, refused, micro_calls;
} Outcome;

/* Runs the scenario on runtime-owned pools (`lend` 0) or on pools this program allocates and
 * lends (`lend` 1), scheduled by the engine (`builtin` 0) or by the built-in policy (1). */
static Outcome run_scenario(const char *backend, int lend, int builtin) {
    /* A three-layer model with 64-byte rows, 16-token blocks, top-k 16, a 32-slot hot buffer. */
    static const char model[] =
        "{\"name\": \"tiny\", \"block_tokens\": 16, \"top_k\": 16, \"layers\": ["
        "{\"sparse\": {\"row_bytes\": 64, \"value_bytes\": 64, \"compress_ratio\": 1, "
        "\"indexer_row_bytes\": 16}},"
        "{\"sparse\": {\"row_bytes\": 64, \"value_bytes\": 64, \"compress_ratio\": 1, "
        "\"indexer_row_bytes\": 16}},"
        "{\"sparse\": {\"row_bytes\": 64, \"value_bytes\": 64, \"compress_ratio\": 1, "
        "\"indexer_row_bytes\": 16}}]}";
    const uint32_t max_len = PROMPT + DECODE + BLOCK;
    const uint64_t pages = (max_len + BLOCK - 1) / BLOCK;
    HsLayoutOptions opts;
    CHECK(hs_layout_options_default(&opts));
    opts.model_json = model;
    opts.gpu_mem = 0;
    /* Per host block: each layer's row in the pool and its 16-B indexer key in the indexer
     * host cache; the host budget holds both. */
    opts.host_mem = (REQUESTS * (pages + 1) + 4) * (ROW_BYTES + 16) * BLOCK * LAYERS;
    opts.max_model_len = max_len;
    opts.device_buffer_size = 32;
    opts.num_gpu_blocks = 48; /* fewer than the requests' pages: pages get reclaimed */
    HsLayout *layout = NULL;
    CHECK(hs_layout_plan(&opts, &layout));
    HsLayoutInfo info;
    CHECK(hs_layout_info(layout, &info));
    EXPECT(info.row_bytes == ROW_BYTES && info.top_k == TOP_K && info.block_size == BLOCK,
           "unexpected geometry");

    HsCoordinatorConfig cc;
    CHECK(hs_coordinator_config_default(&cc));
    cc.max_running = REQUESTS;
    cc.max_batched_tokens = BUDGET;
    cc.reclaim_min_blocks = 0;
    HsCoordinator *coord = NULL;
    CHECK(hs_coordinator_new(layout, &cc, &coord));

    HsRuntimeConfig rc;
    CHECK(hs_runtime_config_default(&rc));
    rc.state_rows = REQUESTS;
    rc.max_step_tokens = REQUESTS;
    rc.max_batched_tokens = BUDGET;
    HsRuntime *rt = NULL;
    void *device_pool = NULL, *host_pool = NULL;
    if (lend) {
        /* The engine's own memory: page-aligned, zeroed, freed by the engine after the runtime. */
        size_t dbytes = (info.gpu_pool_bytes + 4095) / 4096 * 4096;
        size_t hbytes = (info.host_pool_bytes + 4095) / 4096 * 4096;
        device_pool = aligned_alloc(4096, dbytes);
        host_pool = aligned_alloc(4096, hbytes);
        EXPECT(device_pool != NULL && host_pool != NULL, "out of memory");
        memset(device_pool, 0, dbytes);
        memset(host_pool, 0, hbytes);
        HsLentResources lent = {
            .device_pool = device_pool,
            .device_pool_bytes = dbytes,
            .host_pool = host_pool,
            .host_pool_bytes = hbytes,
            .has_stream = false,
            .stream = NULL,
        };
        CHECK(hs_runtime_new_with_pools(layout, backend, "", &rc, &lent, &rt));
    } else {
        CHECK(hs_runtime_new(layout, backend, "", &rc, &rt));
    }
    /* How the host pool was set up (the size first): worth logging at start-up, as it names the
     * pages a pool got and, for a /dev/shm pool on 4 KiB pages, the remount that speeds it up. */
    size_t setup_len = 0;
    CHECK(hs_runtime_host_pool_setup(rt, NULL, 0, &setup_len));
    if (setup_len > 1) {
        char *setup = malloc(setup_len);
        EXPECT(setup != NULL, "out of memory");
        CHECK(hs_runtime_host_pool_setup(rt, setup, setup_len, &setup_len));
        EXPECT(strlen(setup) + 1 == setup_len, "the set-up report is not one string");
        printf("%s: host pool: %s\n", backend, setup);
        free(setup);
    } else {
        /* Only the engine's lent memory on the CPU backend is not set up by the backend. */
        EXPECT(lend, "the runtime's own host pool has no set-up report");
    }
    /* On the CPU backend the slot mapping's address is host memory this program reads in
     * place; on a GPU an engine's kernels read it there, and this host-side forward pass reads
     * a copy. */
    const int on_host = strcmp(backend, "cpu") == 0;
    int32_t *mapping_copy = NULL;

    /* The slot mapping's write groups and the views of their layers. */
    size_t num_write_groups = 0;
    CHECK(hs_runtime_slot_mapping_groups(rt, NULL, 0, &num_write_groups));
    size_t write_groups[8];
    EXPECT(num_write_groups <= 8, "%zu write groups", num_write_groups);
    CHECK(hs_runtime_slot_mapping_groups(rt, write_groups, 8, &num_write_groups));
    HsLayerView views[8][LAYERS];
    uint32_t view_layers[8];
    for (size_t w = 0; w < num_write_groups; w++) {
        HsGroupInfo g;
        CHECK(hs_layout_group(layout, write_groups[w], &g));
        /* The sparse KV is what this forward pass writes (indexer keys are the engine's own). */
        view_layers[w] = g.kind == HS_GROUP_KIND_RESIDENT ? g.num_layers : 0;
        for (uint32_t i = 0; i < view_layers[w]; i++) {
            CHECK(hs_layout_layer_view(layout, write_groups[w], i, &views[w][i]));
        }
    }
    /* Per index group, the views its attention reads (its bucket's resident group). */
    HsLayerView group_views[LAYERS][LAYERS];
    uint32_t group_layers[LAYERS];
    for (uint32_t g = 0; g < info.num_index_groups; g++) {
        HsIndexGroupInfo gi;
        CHECK(hs_layout_index_group(layout, g, &gi));
        group_layers[g] = gi.num_layers;
        for (uint32_t i = 0; i < gi.num_layers; i++) {
            uint32_t layer, bucket;
            uint64_t offset;
            CHECK(hs_layout_index_group_layer(layout, g, i, &layer));
            CHECK(hs_layout_layer_offset(layout, layer, &bucket, &offset));
            HsGroupInfo rg;
            CHECK(hs_layout_group(layout, 2 + bucket, &rg));
            for (uint32_t k = 0; k < rg.num_layers; k++) {
                HsLayerView v;
                CHECK(hs_layout_layer_view(layout, 2 + bucket, k, &v));
                if (v.layer == layer) group_views[g][i] = v;
            }
        }
    }

    HsBuffer *topk_buf = NULL, *rows_buf = NULL, *counts_buf = NULL;
    CHECK(hs_buffer_alloc(rt, REQUESTS * TOP_K * 4, &topk_buf));
    CHECK(hs_buffer_alloc(rt, REQUESTS * TOP_K * 4, &rows_buf));
    CHECK(hs_buffer_alloc(rt, REQUESTS * 4, &counts_buf));
    /* The two micro-batches' own arrays: top-k, rows, counts and state rows. */
    HsBuffer *part_topk[2] = {NULL, NULL}, *part_rows[2] = {NULL, NULL};
    HsBuffer *part_counts[2] = {NULL, NULL}, *part_state[2] = {NULL, NULL};
    for (int p = 0; p < 2; p++) {
        CHECK(hs_buffer_alloc(rt, REQUESTS * TOP_K * 4, &part_topk[p]));
        CHECK(hs_buffer_alloc(rt, REQUESTS * TOP_K * 4, &part_rows[p]));
        CHECK(hs_buffer_alloc(rt, REQUESTS * 4, &part_counts[p]));
        CHECK(hs_buffer_alloc(rt, REQUESTS * 4, &part_state[p]));
    }

    Engine e = {.coord = coord};
    for (uint64_t req = 1; req <= REQUESTS; req++) {
        uint32_t prompt[PROMPT];
        for (uint32_t t = 0; t < PROMPT; t++) prompt[t] = (uint32_t)(1000 * req + t);
        CHECK(hs_coordinator_admit(coord, req, prompt, PROMPT));
        e.waiting[e.num_waiting++] = req;
    }

    Outcome out = {0};
    uint8_t want[ROW_BYTES], got[ROW_BYTES];
    for (;;) {
        bool empty;
        CHECK(hs_coordinator_is_empty(coord, &empty));
        if (empty) break;
        EXPECT(++out.steps < 10000, "no progress in 10000 steps");
        HsCommand *cmd = NULL;
        if (builtin) {
            CHECK(hs_coordinator_step(coord, &cmd));
            CHECK(hs_coordinator_running_ids(coord, e.running, REQUESTS, &e.num_running));
        } else {
            cmd = schedule_step(&e);
        }
        HsCommandInfo ci;
        CHECK(hs_command_info(cmd, &ci));
        /* A request the pools can never serve is refused, the step going on for the others:
         * the engine fails it (none does here: every request fits the layout). */
        for (size_t i = 0; i < ci.num_refused; i++) {
            HsRefusedRequest r;
            CHECK(hs_command_refused(cmd, i, &r));
            fprintf(stderr, "request %" PRIu64 " refused (reason %d: needs %" PRIu64
                    " blocks, the pool has %" PRIu64 ")\n",
                    r.id, (int)r.reason, r.needed, r.capacity);
            CHECK(hs_coordinator_finish(coord, r.id));
            forget(&e, r.id);
            out.refused++;
        }
        CHECK(hs_runtime_begin_step(rt, cmd, NULL));

        HsScheduledRequest sched[REQUESTS];
        int32_t slots[REQUESTS];
        EXPECT(ci.num_scheduled <= REQUESTS, "%zu scheduled", ci.num_scheduled);
        for (size_t i = 0; i < ci.num_scheduled; i++) {
            CHECK(hs_command_scheduled(cmd, i, &sched[i]));
            slots[i] = (int32_t)sched[i].slot;
        }
        /* The forward pass: every computed token's row of every layer, where the slot mapping
         * says (the step's tokens in command order). */
        HsDeviceArray sm;
        uint32_t step_tokens;
        CHECK(hs_runtime_slot_mapping(rt, &sm, &step_tokens));
        const int32_t *mapping = (const int32_t *)(uintptr_t)sm.address;
        if (!on_host) {
            size_t n = (size_t)sm.rows * sm.cols;
            if (mapping_copy == NULL) mapping_copy = malloc(n * sizeof(int32_t));
            EXPECT(mapping_copy != NULL, "out of memory");
            CHECK(hs_runtime_read_slot_mapping(rt, mapping_copy, n));
            mapping = mapping_copy;
        }
        uint32_t t = 0;
        for (size_t i = 0; i < ci.num_scheduled; i++) {
            for (uint32_t k = 0; k < sched[i].num_tokens; k++, t++) {
                uint32_t pos = sched[i].first_token + k;
                for (size_t w = 0; w < num_write_groups; w++) {
                    int32_t row = mapping[w * sm.cols + t];
                    for (uint32_t l = 0; l < view_layers[w]; l++) {
                        EXPECT(row >= 0, "token %u of request %" PRIu64 " has no row", pos,
                               sched[i].id);
                        make_row(sched[i].id, pos, views[w][l].layer, want);
                        CHECK(hs_runtime_write_device_pool(
                            rt, row_offset(&views[w][l], (uint64_t)row), want, ROW_BYTES));
                    }
                }
            }
        }
        EXPECT(t == step_tokens, "%u tokens scheduled, the slot mapping has %u", t, step_tokens);

        /* Decode: each scheduled request's last token attends to a drifting top-k. */
        CHECK(hs_runtime_set_batch(rt, slots, ci.num_scheduled, 0, NULL));
        for (uint32_t g = 0; g < info.num_index_groups; g++) {
            int32_t topk[REQUESTS * TOP_K], rows[REQUESTS * TOP_K], counts[REQUESTS];
            for (size_t i = 0; i < ci.num_scheduled; i++) {
                uint32_t n = sched[i].first_token + sched[i].num_tokens;
                for (uint32_t j = 0; j < TOP_K; j++) {
                    topk[i * TOP_K + j] = (int32_t)((j * 7919 + (out.steps + 13 * g) * 31) % n);
                }
                topk[i * TOP_K] = -1;                      /* no token */
                topk[i * TOP_K + 1] = topk[i * TOP_K + 2]; /* a duplicate */
            }
            size_t entries = ci.num_scheduled * TOP_K;
            if (out.steps % 2 == 1 && ci.num_scheduled >= 2) {
                /* Two micro-batch calls, rows [a, b) each, with their own state rows; one
                 * stream, in order. */
                for (size_t p = 0; p < 2; p++) {
                    size_t a = ci.num_scheduled * p / 2, b = ci.num_scheduled * (p + 1) / 2;
                    uint32_t n = (uint32_t)(b - a);
                    CHECK(hs_buffer_upload_i32(rt, part_topk[p], 0, topk + a * TOP_K, n * TOP_K));
                    CHECK(hs_buffer_upload_i32(rt, part_state[p], 0, slots + a, n));
                    HsLayerCall call = {
                        .group = g,
                        .swap = HS_SWAP_INDEX_GROUP,
                        .topk = part_topk[p],
                        .num_tokens = n,
                        .state_rows = part_state[p],
                        .rows = part_rows[p],
                        .counts = part_counts[p],
                        .stream = NULL,
                    };
                    CHECK(hs_runtime_decode(rt, &call));
                    CHECK(hs_buffer_download_i32(rt, part_rows[p], 0, rows + a * TOP_K, n * TOP_K));
                    CHECK(hs_buffer_download_i32(rt, part_counts[p], 0, counts + a, n));
                    out.micro_calls++;
                }
            } else {
                CHECK(hs_buffer_upload_i32(rt, topk_buf, 0, topk, entries));
                HsLayerCall call = {
                    .group = g,
                    .swap = HS_SWAP_INDEX_GROUP,
                    .topk = topk_buf,
                    .num_tokens = (uint32_t)ci.num_scheduled,
                    .state_rows = NULL, /* the batch */
                    .rows = rows_buf,
                    .counts = counts_buf,
                    .stream = NULL, /* the runtime's */
                };
                CHECK(hs_runtime_decode(rt, &call));
                CHECK(hs_buffer_download_i32(rt, rows_buf, 0, rows, entries));
                CHECK(hs_buffer_download_i32(rt, counts_buf, 0, counts, ci.num_scheduled));
            }
            for (size_t i = 0; i < ci.num_scheduled; i++) {
                int32_t valid = 0;
                for (uint32_t j = 0; j < TOP_K; j++) {
                    int32_t pos = topk[i * TOP_K + j], r = rows[i * TOP_K + j];
                    if (pos < 0) {
                        EXPECT(r == -1, "entry %u has no token but row %d", j, r);
                        continue;
                    }
                    EXPECT(r >= 0, "request %" PRIu64 " token %d has no row", sched[i].id, pos);
                    valid++;
                    for (uint32_t l = 0; l < group_layers[g]; l++) {
                        const HsLayerView *v = &group_views[g][l];
                        make_row(sched[i].id, (uint32_t)pos, v->layer, want);
                        CHECK(hs_runtime_read_device_pool(rt, row_offset(v, (uint64_t)r), got,
                                                          ROW_BYTES));
                        EXPECT(memcmp(want, got, ROW_BYTES) == 0,
                               "step %" PRIu64 " group %u request %" PRIu64
                               " token %d layer %u: row %d holds other bytes",
                               out.steps, g, sched[i].id, pos, v->layer, r);
                        out.verified++;
                    }
                }
                EXPECT(counts[i] == valid, "count %d for %d valid entries", counts[i], valid);
            }
        }
        CHECK(hs_runtime_end_step(rt, cmd, NULL));
        HsReport *report = NULL;
        CHECK(hs_runtime_poll(rt, &report));
        CHECK(hs_coordinator_apply_report(coord, report));
        hs_report_free(report);
        hs_command_free(cmd);

        /* Sample a token for every request whose tokens are all computed; finish at length. */
        for (size_t i = 0; i < e.num_running;) {
            uint64_t id = e.running[i];
            uint32_t n;
            CHECK(hs_coordinator_num_tokens(coord, id, &n));
            if (tokens_left(&e, id) > 0) {
                i++;
            } else if (n >= PROMPT + DECODE) {
                CHECK(hs_coordinator_finish(coord, id));
                forget(&e, id);
            } else {
                uint32_t sampled = 7;
                CHECK(hs_coordinator_append_tokens(coord, id, &sampled, 1));
                i++;
            }
        }
    }
    HsReport *report = NULL;
    CHECK(hs_runtime_drain_report(rt, &report));
    CHECK(hs_coordinator_apply_report(coord, report));
    hs_report_free(report);
    HsPoolUsage usage;
    CHECK(hs_coordinator_pool_usage(coord, &usage));
    EXPECT(usage.gpu_used == 0 && usage.host_used == 0, "blocks left: %u GPU, %u host",
           usage.gpu_used, usage.host_used);
    CHECK(hs_coordinator_check_drained(coord));
    CHECK(hs_runtime_counters(rt, &out.counters));
    out.preemptions = e.preemptions;
    const HsCounters *c = &out.counters;
    printf("%s: %s, %s pools, %" PRIu64 " steps: %" PRIu64
           " rows verified byte for byte, 0 mismatched; %" PRIu64 " preemptions, %" PRIu64
           " waits; %" PRIu64 " hot hits, %" PRIu64 " misses, %" PRIu64
           " pages reclaimed, %" PRIu64 " resolve and %" PRIu64 " remap calls (%" PRIu64
           " of them micro-batch calls)\n",
           backend, builtin ? "built-in policy" : "engine's scheduler",
           lend ? "lent" : "runtime-owned",
           out.steps, out.verified, e.preemptions, e.waits, c->hot_hits, c->hot_misses,
           c->reclaimed_pages, c->resolve_calls, c->remap_calls, out.micro_calls);
    EXPECT(out.verified > 3000, "only %" PRIu64 " rows verified", out.verified);
    EXPECT(out.micro_calls > 0, "no step was cut into micro-batches");
    EXPECT(out.refused == 0, "%" PRIu64 " requests refused", out.refused);
    EXPECT(c->reclaimed_pages > 0 && c->hot_misses > 0 && c->hot_hits > 0,
           "the pool was not tight enough to swap rows in");
    EXPECT(builtin || e.preemptions > 0, "the pool was not tight enough to preempt");
    EXPECT(c->transfers_completed == c->transfers_enqueued, "transfers left in flight");

    hs_buffer_free(topk_buf);
    hs_buffer_free(rows_buf);
    hs_buffer_free(counts_buf);
    for (int p = 0; p < 2; p++) {
        hs_buffer_free(part_topk[p]);
        hs_buffer_free(part_rows[p]);
        hs_buffer_free(part_counts[p]);
        hs_buffer_free(part_state[p]);
    }
    hs_runtime_free(rt); /* before the lent memory: the runtime finishes its work on it first */
    free(device_pool);
    free(host_pool);
    free(mapping_copy);
    hs_coordinator_free(coord);
    hs_layout_free(layout);
    return out;
}

/* `engine [backend]`: the CPU backend by default; `cuda` or `rocm` with a library built with
 * that feature (the lent-pools run is the CPU backend's: device memory lent on a GPU comes from
 * the engine's own allocator, which this program does not link). */
int main(int argc, char **argv) {
    const char *backend = argc > 1 ? argv[1] : "cpu";
    check_errors();
    Outcome owned = run_scenario(backend, 0, 0);
    run_scenario(backend, 0, 1);
    if (strcmp(backend, "cpu") != 0) {
        printf("engine.c: ok on %s (the lent-pools run is the CPU backend's)\n", backend);
        return 0;
    }
    Outcome lent = run_scenario(backend, 1, 0);
    EXPECT(owned.verified == lent.verified && owned.preemptions == lent.preemptions &&
               owned.counters.hot_hits == lent.counters.hot_hits &&
               owned.counters.hot_misses == lent.counters.hot_misses &&
               owned.counters.reclaimed_pages == lent.counters.reclaimed_pages &&
               owned.counters.h2d_bytes == lent.counters.h2d_bytes &&
               owned.counters.d2h_bytes == lent.counters.d2h_bytes,
           "lent pools gave other counters than runtime-owned ones");
    printf("engine.c: ok\n");
    return 0;
}
