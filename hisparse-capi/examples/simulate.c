/* Plans a layout and runs prefill and decode steps of three requests on the CPU backend through
 * the HiSparse C ABI. A forward pass writes a recognisable KV row per (request, token, layer)
 * into the resident pages; every row attention reads, through the indices the runtime returns,
 * is compared with what was written. The GPU pool is tight, so pages are reclaimed and rows are
 * swapped in from the host pool. The scenario runs twice: on pools the runtime allocates, and on
 * pools this program allocates and lends (hs_runtime_new_with_pools); both must give the same
 * counters. Exits 0 only if every row matches and the counters show it.
 *
 *   cargo build -p hisparse-capi
 *   cc -std=c11 -Wall -Wextra -Werror -I hisparse-capi/include hisparse-capi/examples/simulate.c \
 *      target/debug/libhisparse_capi.a -lpthread -ldl -lm -o simulate && ./simulate
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
#define REQUESTS 3
#define PROMPT 96
#define DECODE 24

#define CHECK(call)                                                                          \
    do {                                                                                     \
        HsStatus status_ = (call);                                                           \
        if (status_ != HS_STATUS_OK) {                                                       \
            fprintf(stderr, "simulate.c:%d: %s failed: %s: %s\n", __LINE__, #call,            \
                    hs_status_name(status_), hs_last_error());                               \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "simulate.c:%d: ", __LINE__);                                    \
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
    hs_layout_free(layout);
}

/* Runs the scenario on runtime-owned pools (`lend` 0) or on pools this program allocates and
 * lends (`lend` 1); returns the runtime's counters and the rows verified. */
static HsCounters run_scenario(int lend, uint64_t *verified_out) {
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
    opts.host_mem = (REQUESTS * (pages + 1) + 4) * ROW_BYTES * BLOCK * LAYERS;
    opts.max_model_len = max_len;
    opts.device_buffer_size = 32;
    opts.num_gpu_blocks = 32; /* fewer than the requests' pages: pages get reclaimed */
    HsLayout *layout = NULL;
    CHECK(hs_layout_plan(&opts, &layout));
    HsLayoutInfo info;
    CHECK(hs_layout_info(layout, &info));
    EXPECT(info.row_bytes == ROW_BYTES && info.top_k == TOP_K && info.block_size == BLOCK,
           "unexpected geometry");
    printf("layout: %u sparse layers, %u index groups, %u GPU blocks of %" PRIu64
           " B, %u host blocks of %" PRIu64 " B\n",
           info.num_sparse_layers, info.num_index_groups, info.num_gpu_blocks,
           info.bytes_per_block, info.host_num_blocks, info.host_block_stride);

    uint32_t bucket_of[LAYERS];
    uint64_t offset_of[LAYERS];
    for (uint32_t l = 0; l < LAYERS; l++) {
        CHECK(hs_layout_layer_offset(layout, l, &bucket_of[l], &offset_of[l]));
    }

    HsCoordinatorConfig cc;
    CHECK(hs_coordinator_config_default(&cc));
    cc.max_running = REQUESTS;
    cc.max_batched_tokens = 4096;
    cc.reclaim_min_blocks = 0;
    HsCoordinator *coord = NULL;
    CHECK(hs_coordinator_new(layout, &cc, &coord));

    HsRuntimeConfig rc;
    CHECK(hs_runtime_config_default(&rc));
    rc.state_rows = REQUESTS;
    rc.max_step_tokens = REQUESTS;
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
        CHECK(hs_runtime_new_with_pools(layout, "cpu", "", &rc, &lent, &rt));
    } else {
        CHECK(hs_runtime_new(layout, "cpu", "", &rc, &rt));
    }

    HsBuffer *topk_buf = NULL, *rows_buf = NULL, *counts_buf = NULL;
    CHECK(hs_buffer_alloc(rt, REQUESTS * TOP_K * 4, &topk_buf));
    CHECK(hs_buffer_alloc(rt, REQUESTS * TOP_K * 4, &rows_buf));
    CHECK(hs_buffer_alloc(rt, REQUESTS * 4, &counts_buf));

    for (uint64_t req = 1; req <= REQUESTS; req++) {
        uint32_t prompt[PROMPT];
        for (uint32_t t = 0; t < PROMPT; t++) prompt[t] = (uint32_t)(1000 * req + t);
        CHECK(hs_coordinator_admit(coord, req, prompt, PROMPT));
    }

    int finished[REQUESTS + 1] = {0};
    uint64_t verified = 0, steps = 0;
    int32_t *pages_row = malloc(sizeof(int32_t) * info.max_pages_per_request);
    EXPECT(pages_row != NULL, "out of memory");
    uint8_t want[ROW_BYTES], got[ROW_BYTES];
    for (;;) {
        bool empty;
        CHECK(hs_coordinator_is_empty(coord, &empty));
        if (empty) break;
        EXPECT(++steps < 10000, "no progress in 10000 steps");
        HsCommand *cmd = NULL;
        CHECK(hs_coordinator_step(coord, &cmd));
        HsCommandInfo ci;
        CHECK(hs_command_info(cmd, &ci));
        CHECK(hs_runtime_begin_step(rt, cmd, NULL));

        HsScheduledRequest sched[REQUESTS];
        int32_t slots[REQUESTS];
        EXPECT(ci.num_scheduled <= REQUESTS, "%zu scheduled", ci.num_scheduled);
        for (size_t i = 0; i < ci.num_scheduled; i++) {
            CHECK(hs_command_scheduled(cmd, i, &sched[i]));
            slots[i] = (int32_t)sched[i].slot;
        }
        /* The forward pass: each computed token's row into its resident page of every layer. */
        for (size_t i = 0; i < ci.num_scheduled; i++) {
            const HsScheduledRequest *s = &sched[i];
            for (uint32_t pos = s->first_token; pos < s->first_token + s->num_tokens; pos++) {
                for (uint32_t l = 0; l < LAYERS; l++) {
                    CHECK(hs_runtime_resident_row(rt, bucket_of[l], s->slot, pages_row,
                                                  info.max_pages_per_request));
                    int32_t block = pages_row[pos / BLOCK];
                    EXPECT(block > 0, "request %" PRIu64 " page %u has no resident block", s->id,
                           pos / BLOCK);
                    uint64_t row = (uint64_t)block * info.attention_block_stride + pos % BLOCK;
                    make_row(s->id, pos, l, want);
                    CHECK(hs_runtime_write_device_pool(rt, offset_of[l] + row * ROW_BYTES, want,
                                                       ROW_BYTES));
                }
            }
        }
        CHECK(hs_runtime_set_batch(rt, slots, ci.num_scheduled, 0, NULL));
        for (uint32_t g = 0; g < info.num_index_groups; g++) {
            /* The indexer: top-k positions below each request's length, drifting with the
             * step; entry 0 is -1 (no token), entry 1 repeats entry 2. */
            int32_t topk[REQUESTS * TOP_K], rows[REQUESTS * TOP_K], counts[REQUESTS];
            for (size_t i = 0; i < ci.num_scheduled; i++) {
                uint32_t n = sched[i].first_token + sched[i].num_tokens;
                for (uint32_t j = 0; j < TOP_K; j++) {
                    topk[i * TOP_K + j] = (int32_t)((j * 7919 + (steps + 13 * g) * 31) % n);
                }
                topk[i * TOP_K] = -1;
                topk[i * TOP_K + 1] = topk[i * TOP_K + 2];
            }
            size_t entries = ci.num_scheduled * TOP_K;
            CHECK(hs_buffer_upload_i32(rt, topk_buf, 0, topk, entries));
            CHECK(hs_runtime_resolve_index_group(rt, g, topk_buf, (uint32_t)ci.num_scheduled,
                                                 rows_buf, counts_buf, NULL));
            CHECK(hs_buffer_download_i32(rt, rows_buf, 0, rows, entries));
            CHECK(hs_buffer_download_i32(rt, counts_buf, 0, counts, ci.num_scheduled));
            HsIndexGroupInfo gi;
            CHECK(hs_layout_index_group(layout, g, &gi));
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
                    for (uint32_t li = 0; li < gi.num_layers; li++) {
                        uint32_t l;
                        CHECK(hs_layout_index_group_layer(layout, g, li, &l));
                        make_row(sched[i].id, (uint32_t)pos, l, want);
                        CHECK(hs_runtime_read_device_pool(
                            rt, offset_of[l] + (uint64_t)r * ROW_BYTES, got, ROW_BYTES));
                        EXPECT(memcmp(want, got, ROW_BYTES) == 0,
                               "step %" PRIu64 " group %u request %" PRIu64
                               " token %d layer %u: row %d holds other bytes",
                               steps, g, sched[i].id, pos, l, r);
                        verified++;
                    }
                }
                EXPECT(counts[i] == valid, "count %d for %d valid entries", counts[i], valid);
            }
        }
        CHECK(hs_runtime_end_step(rt, cmd, NULL));
        CHECK(hs_runtime_poll_and_report(rt, coord, NULL));
        hs_command_free(cmd);
        /* Sample a token for every request whose tokens are all computed; finish at length. */
        for (uint64_t req = 1; req <= REQUESTS; req++) {
            if (finished[req]) continue;
            uint32_t tokens, computed;
            CHECK(hs_coordinator_num_tokens(coord, req, &tokens));
            CHECK(hs_coordinator_num_computed(coord, req, &computed));
            if (computed < tokens) continue;
            if (tokens >= PROMPT + DECODE) {
                CHECK(hs_coordinator_finish(coord, req));
                finished[req] = 1;
            } else {
                uint32_t sampled = 7;
                CHECK(hs_coordinator_append_tokens(coord, req, &sampled, 1));
            }
        }
    }
    CHECK(hs_runtime_drain(rt, coord));
    HsCounters c;
    CHECK(hs_runtime_counters(rt, &c));
    printf("%s pools, %" PRIu64 " steps: %" PRIu64 " rows verified byte for byte, 0 mismatched; %" PRIu64
           " hot hits, %" PRIu64 " misses, %" PRIu64 " pages reclaimed, %" PRIu64
           " resolve and %" PRIu64 " remap calls, %" PRIu64 "/%" PRIu64 " transfers completed\n",
           lend ? "lent" : "runtime-owned", steps, verified, c.hot_hits, c.hot_misses,
           c.reclaimed_pages, c.resolve_calls, c.remap_calls, c.transfers_completed,
           c.transfers_enqueued);
    EXPECT(verified > 3000, "only %" PRIu64 " rows verified", verified);
    EXPECT(c.reclaimed_pages > 0 && c.hot_misses > 0 && c.hot_hits > 0,
           "the pool was not tight enough to swap rows in");
    EXPECT(c.transfers_completed == c.transfers_enqueued, "transfers left in flight");

    free(pages_row);
    hs_buffer_free(topk_buf);
    hs_buffer_free(rows_buf);
    hs_buffer_free(counts_buf);
    hs_runtime_free(rt); /* before the lent memory: the runtime finishes its work on it first */
    free(device_pool);
    free(host_pool);
    hs_coordinator_free(coord);
    hs_layout_free(layout);
    *verified_out = verified;
    return c;
}

int main(void) {
    check_errors();
    uint64_t owned_rows, lent_rows;
    HsCounters owned = run_scenario(0, &owned_rows);
    HsCounters lent = run_scenario(1, &lent_rows);
    EXPECT(owned_rows == lent_rows && owned.hot_hits == lent.hot_hits &&
               owned.hot_misses == lent.hot_misses &&
               owned.reclaimed_pages == lent.reclaimed_pages &&
               owned.h2d_bytes == lent.h2d_bytes && owned.d2h_bytes == lent.d2h_bytes,
           "lent pools gave other counters than runtime-owned ones");
    printf("simulate.c: ok\n");
    return 0;
}
