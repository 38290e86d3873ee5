#include "parallel/update_rule.h"

#include "core/error.h"
#include "parallel/flat_optimizer.h"
#include "tensor/adamw.h"
#include "tensor/elementwise.h"

namespace mpitron {
namespace {

class AdamWRule final : public UpdateRule {
 public:
  explicit AdamWRule(const OptimizerConfig& c) : c_(c) {}
  const char* name() const override { return "adam"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  void apply(const Tensor& master, const Tensor& grad, const std::vector<Tensor>& s, const Tensor& copy,
             const UpdateArgs& u) const override {
    AdamWArgs a;
    a.lr = u.lr;
    a.beta1 = c_.beta1;
    a.beta2 = c_.beta2;
    a.eps = c_.eps;
    a.weight_decay = u.weight_decay;
    a.grad_scale = u.grad_scale;
    a.step = u.step;
    adamw_step(master, grad, s[0], s[1], copy, a);
  }

 private:
  OptimizerConfig c_;
};

// Three passes of tensor/elementwise.h's axpby (no kernel of its own: SGD's state is one
// buffer and its update two multiply-adds).
class SGDRule final : public UpdateRule {
 public:
  explicit SGDRule(const OptimizerConfig& c) : momentum_(c.sgd_momentum) {}
  const char* name() const override { return "sgd"; }
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  void apply(const Tensor& master, const Tensor& grad, const std::vector<Tensor>& s, const Tensor& copy,
             const UpdateArgs& u) const override {
    const Tensor& buf = s[0];
    // buf = momentum·buf + g (the buffer starts at zero: the first step's is g itself, as torch's clone)
    axpby(u.grad_scale, grad, momentum_, buf);
    if (u.weight_decay != 0.0f) axpby(u.weight_decay, master, 1.0f, buf);  // + wd·p (d = g + wd·p)
    axpby(-u.lr, buf, 1.0f, master);
    if (copy.defined()) cast(master, copy);
  }

 private:
  float momentum_;
};

struct Row {
  const char* name;
  std::unique_ptr<UpdateRule> (*make)(const OptimizerConfig&);
};
const std::vector<Row>& update_rules() {
  static const std::vector<Row> rows = {
      {"adam", [](const OptimizerConfig& c) -> std::unique_ptr<UpdateRule> { return std::make_unique<AdamWRule>(c); }},
      {"sgd", [](const OptimizerConfig& c) -> std::unique_ptr<UpdateRule> { return std::make_unique<SGDRule>(c); }},
      // dist_muon: the same rule; model/training/model_states.cpp shards its states by whole tensors.
      {"muon", make_muon_rule},
      {"dist_muon", make_muon_rule},
  };
  return rows;
}

}  // namespace

std::unique_ptr<UpdateRule> make_update_rule(const OptimizerConfig& cfg) {
  for (const Row& r : update_rules())
    if (cfg.optimizer == r.name) return r.make(cfg);
  MPT_THROW(str("--optimizer ", cfg.optimizer, " is not built"), "use --optimizer adam, sgd, muon or dist_muon");
}

std::vector<std::string> built_optimizers() {
  std::vector<std::string> v;
  for (const Row& r : update_rules()) v.push_back(r.name);
  return v;
}

std::vector<std::string> optimizer_state_names(const std::string& optimizer) {
  OptimizerConfig c;
  c.optimizer = optimizer;
  for (const Row& r : update_rules())
    if (optimizer == r.name) return r.make(c)->state_names();
  return {};
}

}  // namespace mpitron
