#include "model/checkpoint_args.h"
#include "model/flag_given.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/arch_flags.h"

namespace po = boost::program_options;

namespace mpitron {

void reconcile_model_flags(const po::variables_map& vm, const GPTConfig& saved, GPTConfig& m, bool fill,
                           const std::string& where, bool check_seq_length) {
  struct IntFlag {
    const char* flag;
    int64_t GPTConfig::*field;
  };
  const IntFlag ints[] = {{"num-layers", &GPTConfig::num_layers},
                          {"hidden-size", &GPTConfig::hidden_size},
                          {"num-attention-heads", &GPTConfig::num_attention_heads},
                          {"seq-length", &GPTConfig::seq_length},
                          {"max-position-embeddings", &GPTConfig::max_position_embeddings}};
  MPT_CHECK(saved.bert == m.bert,
            str("checkpoint ", where, " holds a ", saved.bert ? "BERT (pretrain_bert)" : "decoder (pretrain_gpt)",
                " but this run builds a ", m.bert ? "BERT" : "decoder"),
            saved.bert ? "load it with pretrain_bert" : "load it with pretrain_gpt");
  std::vector<std::string> wrong;
  if (m.bert) {  // BERT's own choices: --bert-post-ln, --bert-no-binary-head
    const bool post_given = flag_given(vm, "bert-post-ln") && vm["bert-post-ln"].as<bool>();
    const bool nobin_given = flag_given(vm, "bert-no-binary-head") && vm["bert-no-binary-head"].as<bool>();
    if (fill && !post_given && !nobin_given) {
      m.post_ln = saved.post_ln;
      m.binary_head = saved.binary_head;
      m.num_tokentypes = saved.num_tokentypes;
    } else {
      if (m.post_ln != saved.post_ln)
        wrong.push_back(str(m.post_ln ? "--bert-post-ln" : "no --bert-post-ln", " (checkpoint: ",
                            saved.post_ln ? "post-LN" : "pre-LN", ")"));
      if (m.binary_head != saved.binary_head)
        wrong.push_back(str(m.binary_head ? "no --bert-no-binary-head" : "--bert-no-binary-head", " (checkpoint: ",
                            saved.binary_head ? "binary head" : "no binary head", ")"));
    }
  }
  for (const IntFlag& f : ints) {
    if (!check_seq_length && f.field == &GPTConfig::seq_length) continue;
    if (flag_given(vm, f.flag)) {
      if (m.*f.field != saved.*f.field) wrong.push_back(str("--", f.flag, " ", m.*f.field, " (checkpoint: ", saved.*f.field, ")"));
    } else if (fill) {
      m.*f.field = saved.*f.field;
    }
  }
  // --ffn-hidden-size: compare the effective widths (0 means 4·hidden).
  if (flag_given(vm, "ffn-hidden-size")) {
    if (m.ffn() != saved.ffn()) wrong.push_back(str("--ffn-hidden-size ", m.ffn(), " (checkpoint: ", saved.ffn(), ")"));
  } else if (fill) {
    m.ffn_hidden_size = saved.ffn();
  }
  if (flag_given(vm, "layernorm-epsilon")) {
    if (std::fabs(m.layernorm_epsilon - saved.layernorm_epsilon) > 1e-12f * std::fabs(saved.layernorm_epsilon) + 1e-30f)
      wrong.push_back(str("--layernorm-epsilon ", m.layernorm_epsilon, " (checkpoint: ", saved.layernorm_epsilon, ")"));
  } else if (fill) {
    m.layernorm_epsilon = saved.layernorm_epsilon;
  }
  if (architecture_flags_given(vm)) {
    const std::string arch = architecture_differences(m, saved);
    if (!arch.empty()) wrong.push_back(arch);
  } else if (fill) {
    const float eps = m.layernorm_epsilon;
    copy_architecture(saved, m);
    m.layernorm_epsilon = eps;  // reconciled above
  }
  if (!wrong.empty()) {
    std::string list;
    for (const auto& w : wrong) list += (list.empty() ? "" : ", ") + w;
    MPT_THROW(str("the model flags disagree with the checkpoint ", where, ": ", list),
              "give the values the checkpoint was trained with, or drop them (--use-checkpoint-args fills them)");
  }
}

void add_model_shape_flags(po::options_description& desc, GPTConfig& m) {
  po::options_description g("Model shape (optional: checked against the checkpoint)");
  g.add_options()
      ("num-layers", po::value(&m.num_layers), "transformer blocks")
      ("hidden-size", po::value(&m.hidden_size), "residual stream width")
      ("num-attention-heads", po::value(&m.num_attention_heads), "attention heads")
      ("ffn-hidden-size", po::value(&m.ffn_hidden_size), "MLP width")
      ("seq-length", po::value(&m.seq_length), "tokens per sample the model was trained with")
      ("max-position-embeddings", po::value(&m.max_position_embeddings), "position table rows")
      ("layernorm-epsilon", po::value(&m.layernorm_epsilon), "layernorm epsilon");
  desc.add(g);
}

}  // namespace mpitron
