// The limits remat enforces on what users, workers and trials send it: the one home of these
// numbers. docs/service.md ("Limits") lists them; the spec reader (specfile/), ValidateSpec
// (search/spec.h), the worker's reports and the coordinator's gRPC server read them from here.
// Each is far above any real job (the largest Megatron recipes have ~128 layers, hidden 16384,
// a few thousand GPUs) and low enough that planning stays fast and no reply outgrows gRPC's
// message limit. Thread-safety: constants.
#pragma once

#include <cstddef>
#include <cstdint>

namespace remat::search::limits {

// Files a client reads (spec, replay table): read only when a regular file at most this big.
inline constexpr size_t kMaxSpecFileBytes = 1u << 20;          // 1 MiB
inline constexpr size_t kMaxReplayTableFileBytes = 16u << 20;  // 16 MiB
inline constexpr size_t kMaxReplayTableEntries = 100000;
// A configuration `remat import bridge` reads.
inline constexpr size_t kMaxImportFileBytes = 4u << 20;
// A rank's result file (remat-trial --result), read by the worker.
inline constexpr size_t kMaxResultFileBytes = 16u << 20;
// A command-backend job's metrics file (worker/metrics_file.h), per rank.
inline constexpr size_t kMaxMetricsFileBytes = 16u << 20;

// A worker's registration (RegisterRequest): slots (one per Gpu entry) at most kMaxWorldSize,
// names (hostname, GPU names, backends, command templates, version keys and values) at most
// kMaxNameBytes, and these counts; the whole message at most kMaxRegistrationBytes.
inline constexpr size_t kMaxRegistrationBytes = 4u << 20;
inline constexpr int kMaxWorkerBackends = 16;
inline constexpr int kMaxWorkerCommandTemplates = 1024;
inline constexpr int kMaxVersionEntries = 32;  // also a result's `versions`

// Strings in a spec: the name, template names, file names, enum values.
inline constexpr size_t kMaxNameBytes = 256;         // `name`, `search.command_template`
inline constexpr size_t kMaxPathBytes = 4096;        // `search.replay_table`
inline constexpr size_t kMaxStringValueBytes = 4096;  // any other scalar in a spec or table
// A spec's YAML tree: values once aliases are expanded, and nesting depth.
inline constexpr size_t kMaxYamlNodes = 100000;
inline constexpr int kMaxYamlDepth = 32;

// A policy string ("selective:[core_attn,mlp]"); the longest valid one is about 100 bytes.
inline constexpr size_t kMaxPolicyBytes = 256;

// Strings from trials (messages, stderr tails) once they enter a protobuf message: valid UTF-8,
// cut to this many bytes.
inline constexpr size_t kMaxTrialMessageBytes = 4096;
// The coordinator's gRPC messages, both ways (a search with its replay table, a search's
// trials), and how much of that one LeaseTrial reply fills before it stops adding trials.
inline constexpr int kMaxGrpcMessageBytes = 64 << 20;
inline constexpr size_t kMaxLeaseReplyBytes = 16u << 20;

// A step time a result may carry (trial, rank, step, proxy): 0 (not measured) or from 1 µs to
// kMaxTrialTimeoutS. Throughput is divided by it: a denormal one made tokens/s infinite.
inline constexpr double kMinStepTimeS = 1e-6;

// A value quoted in an error line is cut to this many bytes.
inline constexpr size_t kMaxQuotedValueBytes = 64;

// Model and layout ranges (inclusive upper bounds; the lower bounds are the fields' own, e.g.
// positive). Far above real recipes, low enough that the memory and FLOP model's doubles stay
// exact and planning takes milliseconds.
inline constexpr int64_t kMaxLayers = 1024;         // num_layers, proxy depths, stage layers, VPP
inline constexpr int64_t kMaxHiddenSize = 1 << 18;  // hidden, FFN, MoE FFN, LoRA ranks, head dims
inline constexpr int64_t kMaxAttentionHeads = 4096;    // heads, query groups
inline constexpr int64_t kMaxSeqLength = 1 << 22;      // tokens
inline constexpr int64_t kMaxVocabSize = 1 << 22;
inline constexpr int64_t kMaxExperts = 4096;           // experts, router top-k
inline constexpr int64_t kMaxMicroBatchSize = 4096;    // sequences
inline constexpr int64_t kMaxGlobalBatchSize = 1 << 24;
inline constexpr int64_t kMaxParallelSize = 1 << 16;   // each parallel degree
inline constexpr int64_t kMaxWorldSize = 1 << 16;      // TP × CP × PP × DP
inline constexpr int64_t kMaxSteps = 100000;           // warmup_steps, measure_steps each
inline constexpr int64_t kMaxTrials = 100000;          // search.max_trials
inline constexpr double kMaxTrialTimeoutS = 7 * 24 * 3600.0;  // one week
inline constexpr double kMaxMemoryGib = 1 << 20;       // budget and headroom (1 PiB)

}  // namespace remat::search::limits
