#include "model/flags/inference_flags.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/flags/flag_given.h"
#include "model/flags/model_flags.h"
#include "model/flags/prefix_eviction.h"
#include "model/flags/megatron_compat.h"

namespace po = boost::program_options;

namespace mpitron {

namespace {

struct Ignored {
  const char* name;
  bool takes_value;
  const char* why;
};

// Pretraining flags a generation/evaluation script carries whose no-op deserves its own reason.
const Ignored kIgnored[] = {
    {"no-load-optim", false, "inference reads only the weights"},
    {"no-load-rng", false, "inference reads only the weights"},
    {"use-checkpoint-args", false, "the model shape always comes from the checkpoint here"},
    {"make-vocab-size-divisible-by", true, "the checkpoint's padded vocabulary is used"},
    {"init-method-std", true, "the weights come from the checkpoint"},
    {"hidden-dropout", true, "inference runs without dropout"},
    {"attention-dropout", true, "inference runs without dropout"},
    {"log-interval", true, "inference logs per sample or per evaluation"},
};

// Pretraining flags that are not accepted as no-ops: --config would read flags from a
// file the tools do not read, so it stays unknown.
bool never_training_only(const std::string& name) { return name == "config" || name == "help"; }

bool has(const po::options_description& d, const std::string& name) { return d.find_nothrow(name, false) != nullptr; }

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

}  // namespace

void add_inference_flags(po::options_description& desc, InferenceFlags& f, bool with_seq_length,
                         const po::options_description& pretraining) {
  po::options_description g("Megatron GPT_ARGS (the model shape is checked against the checkpoint)");
  f.with_seq_length = with_seq_length;
  f.pretraining = &pretraining;
  // Adds (name, semantic, help) unless the tool declared the name itself.
  const auto add = [&](po::options_description& grp, const char* name, const po::value_semantic* v, const char* help) {
    if (has(desc, name) || has(grp, name)) {
      delete v;
      return false;
    }
    grp.add_options()(name, v, help);
    return true;
  };
  add(g, "fp16", po::bool_switch(&f.fp16), "run the model in fp16 (weights rounded from the f32 checkpoint)");
  add(g, "bf16", po::bool_switch(&f.bf16), "run the model in bf16");
  for (const Ignored& i : kIgnored)
    if (i.takes_value ? add(g, i.name, po::value<std::string>(), i.why) : add(g, i.name, po::bool_switch(), i.why))
      f.no_op.push_back(i.name);
  desc.add(g);
  // The architecture table's rows (model/arch_fields.h), but for the names the tool declared itself.
  add_model_flags(desc, {FlagScope::Model}, "Model and architecture (checked against the checkpoint; docs/model-families.md)",
                  [&](const ArchField& row, const ArchFlag& flag) {
                    return (with_seq_length || row.key != "seq_length") && !has(desc, flag.name);
                  });

  po::options_description par("Parallel layout and device (run under mpirun -np TP x PP)");
  add(par, "tensor-model-parallel-size", po::value(&f.tp),
      "tensor-parallel ranks (default 1); a checkpoint of any layout loads under any layout");
  add(par, "pipeline-model-parallel-size", po::value(&f.pp), "pipeline stages (default 1)");
  add(par, "device", po::value(&f.device), "auto (a GPU when there is one) | cpu | cuda");
  add(par, "force-mpi-for-device", po::bool_switch(&f.force_mpi_for_device),
      "MPI (host-staged) instead of NCCL for GPU tensors: ranks sharing one GPU");
  desc.add(par);

  DynamicBatchingFlags& b = f.batching;
  po::options_description dyn("Dynamic batching (Megatron-Core's dynamic inference engine)");
  add(dyn, "inference-dynamic-batching", po::bool_switch(&b.enabled),
      "serve many requests at once over the paged KV cache (without it the server runs one request at a time)");
  add(dyn, "inference-dynamic-batching-buffer-size-gb", po::value(&b.buffer_size_gb),
      "KV cache per rank in GiB (default: max-requests sequences of max_position_embeddings, at most 1 GiB)");
  add(dyn, "inference-dynamic-batching-block-size", po::value(&b.block_size), "positions per KV block (default 256)");
  add(dyn, "inference-dynamic-batching-max-requests", po::value(&b.max_requests), "requests in flight at once");
  add(dyn, "inference-dynamic-batching-max-tokens", po::value(&b.max_tokens),
      "tokens (prompt and decode) per step (default 512)");
  add(dyn, "enable-chunked-prefill", po::bool_switch(&b.chunked_prefill),
      "split prompts longer than a step's token budget over several steps");
  add(dyn, "num-speculative-tokens", po::value(&b.num_speculative_tokens),
      "speculative decoding with the model's MTP layers: tokens drafted per step for greedy requests (1; the "
      "output is plain greedy decoding's), acceptance rate in the engine's line");
  add(dyn, "inference-dynamic-batching-prefix-caching", po::bool_switch(&b.prefix_caching),
      "requests whose prompts start alike share the KV blocks of the common prefix and compute only the rest "
      "(hit rate in the engine's line)");
  add(dyn, "inference-dynamic-batching-prefix-caching-eviction-policy", po::value(&b.prefix_caching_eviction_policy),
      "ref_zero (default: a cached block leaves with its last request) | lru (unreferenced cached blocks stay, the "
      "least recently used evicted when blocks are needed)");
  desc.add(dyn);

  if (!has(desc, "distributed-backend")) add_noop_flags(desc);

  // Every other pretraining flag, with the arity pretraining gives it.
  po::options_description train("Pretraining flags (accepted from a Megatron script; no effect here)");
  for (const auto& o : pretraining.options()) {
    const std::string& name = o->long_name();
    if (name.empty() || never_training_only(name) || has(desc, name) || has(train, name)) continue;
    const po::value_semantic* sem = o->semantic().get();
    if (sem->max_tokens() == 0) train.add_options()(name.c_str(), po::bool_switch(), "pretraining switch");
    else if (sem->max_tokens() > 1)
      train.add_options()(name.c_str(), po::value<std::vector<std::string>>()->multitoken()->composing(), "pretraining flag");
    else train.add_options()(name.c_str(), po::value<std::string>(), "pretraining flag");
    f.training_only.push_back(name);
  }
  desc.add(train);
}

void check_inference_flags(const po::variables_map& vm, InferenceFlags& f) {
  MPT_CHECK(!(f.fp16 && f.bf16), "--fp16 and --bf16 were both given", "pick one");
  MPT_CHECK(f.tp >= 1 && f.pp >= 1,
            str("--tensor-model-parallel-size and --pipeline-model-parallel-size must be >= 1, got ", f.tp, " and ", f.pp),
            "");
  MPT_CHECK(f.device == "auto" || f.device == "cpu" || f.device == "cuda",
            str("--device ", f.device, " is not auto, cpu or cuda"), "");
  const DynamicBatchingFlags& b = f.batching;
  // 0 stands for "the default" inside (kv_cache_blocks, the tools' request counts): an explicit 0 is
  // refused, not silently replaced by the default.
  const bool buffer_given = flag_given(vm, "inference-dynamic-batching-buffer-size-gb");
  MPT_CHECK(std::isfinite(b.buffer_size_gb) && (buffer_given ? b.buffer_size_gb > 0 : b.buffer_size_gb >= 0),
            str("--inference-dynamic-batching-buffer-size-gb must be > 0, got ", b.buffer_size_gb),
            "leave it out for the default (max-requests sequences of max_position_embeddings, at most 1 GiB)");
  MPT_CHECK(b.block_size >= 1, str("--inference-dynamic-batching-block-size must be >= 1, got ", b.block_size), "");
  const bool requests_given = flag_given(vm, "inference-dynamic-batching-max-requests");
  MPT_CHECK(requests_given ? b.max_requests >= 1 : b.max_requests >= 0,
            str("--inference-dynamic-batching-max-requests must be >= 1, got ", b.max_requests),
            "leave it out for the tool's default (the server: 64 with --inference-dynamic-batching, else 128; "
            "generate_text: --micro-batch-size)");
  MPT_CHECK(b.max_tokens >= 1, str("--inference-dynamic-batching-max-tokens must be >= 1, got ", b.max_tokens), "");
  parse_prefix_eviction(b.prefix_caching_eviction_policy);  // throws naming the flag and the choices
  MPT_CHECK(b.prefix_caching || !flag_given(vm, "inference-dynamic-batching-prefix-caching-eviction-policy"),
            "--inference-dynamic-batching-prefix-caching-eviction-policy without --inference-dynamic-batching-prefix-caching",
            "add --inference-dynamic-batching-prefix-caching (the policy says what it keeps)");
  MPT_CHECK(!b.prefix_caching || b.enabled,
            "--inference-dynamic-batching-prefix-caching without --inference-dynamic-batching: prefix caching shares KV "
            "blocks between the requests of the dynamic engine",
            "add --inference-dynamic-batching");
  for (const Ignored& i : kIgnored) {
    // Only where add_inference_flags declared it (a tool's own flag of that name means something).
    if (std::find(f.no_op.begin(), f.no_op.end(), i.name) == f.no_op.end() || !vm.count(i.name)) continue;
    if (!i.takes_value && !vm[i.name].as<bool>()) continue;
    f.notes.push_back(str("--", i.name, ": ", i.why));
  }
  check_noop_flags(vm, f.notes);
  std::vector<std::string> given;
  for (const std::string& name : f.training_only) {
    if (!vm.count(name)) continue;
    const po::option_description& o = f.pretraining->find(name, false);
    std::vector<std::string> tokens;
    if (o.semantic()->max_tokens() == 0) {
      if (!vm[name].as<bool>()) continue;
    } else if (o.semantic()->max_tokens() > 1) {
      tokens = vm[name].as<std::vector<std::string>>();
    } else {
      tokens = {vm[name].as<std::string>()};
    }
    if (!tokens.empty()) {  // the value must be one pretraining would take
      boost::any v;
      try {
        o.semantic()->parse(v, tokens, true);
      } catch (const std::exception& e) {
        MPT_THROW(str("--", name, " ", joined(tokens, " "), ": ", e.what()),
                  "a pretraining flag is checked as pretrain_gpt checks it, even where it has no effect");
      }
    }
    given.push_back("--" + name);
  }
  if (!given.empty())
    f.notes.push_back(str(joined(given, ", "), ": pretraining flags, accepted from the script; no effect here"));
  f.given = given_model_flags(vm);
}

void check_against_checkpoint(const po::variables_map& vm, const InferenceFlags& f, const GPTConfig& checkpoint,
                              const std::string& load_dir, bool allow_t5) {
  MPT_CHECK(!checkpoint.bert && (allow_t5 || !checkpoint.t5),
            str("checkpoint ", load_dir, " holds a ", checkpoint.kind(), " (", checkpoint.tool(),
                "): generate_text, evaluate and the server run decoder language models (GPT-2, Llama); generate_text and "
                "text_generation_server also a T5"),
            checkpoint.t5 ? "decode it with generate_text or serve it with text_generation_server; a T5 is exported with convert_checkpoint (transformers' T5ForConditionalGeneration generates)"
                          : "use a pretrain_gpt checkpoint; a BERT is fine-tuned with finetune or exported with convert_checkpoint");
  (void)vm;
  GPTConfig m;
  m.t5 = checkpoint.t5;  // (allowed above) its flags are compared as a T5's
  apply_model_flags(f.given, m);
  reconcile_with_checkpoint(f.given, checkpoint, m, /*fill=*/false, load_dir,
                            f.with_seq_length ? std::set<std::string>{} : std::set<std::string>{"seq_length"});
}

}  // namespace mpitron
