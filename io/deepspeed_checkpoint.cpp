#include "io/deepspeed_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace mpitron::io {

namespace fs = std::filesystem;

namespace {

std::string tag_dir_of(const std::string& dir) {
  const fs::path d(dir);
  if (fs::exists(d / "latest")) {
    std::ifstream in(d / "latest");
    std::string tag;
    in >> tag;
    MPT_CHECK(!tag.empty() && tag.find('/') == std::string::npos && tag != "..",
              str(dir, "/latest holds '", tag, "', not a tag directory name"), "");
    MPT_CHECK(fs::is_directory(d / tag), str(dir, "/latest names ", tag, ", which is not a directory there"),
              "the checkpoint is incomplete");
    return (d / tag).string();
  }
  return dir;
}

const PyValue& osd_of(const TorchFile& f) {
  const PyValue* o = f.root().get("optimizer_state_dict");
  MPT_CHECK(o && o->is_dict(), str(f.label(), " has no optimizer_state_dict"), "is it a DeepSpeed ZeRO optim_states file?");
  return *o;
}

}  // namespace

DeepSpeedCheckpoint::DeepSpeedCheckpoint(const std::string& dir) : tag_dir_(tag_dir_of(dir)) {
  const fs::path t(tag_dir_);
  std::error_code ec;
  std::vector<std::string> optim;
  bool layer_files = false, tp = false;
  for (const auto& e : fs::directory_iterator(t, ec)) {
    const std::string n = e.path().filename().string();
    const std::string suffix = "_optim_states.pt";
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) optim.push_back(n);
    layer_files |= n.rfind("layer_", 0) == 0;
    tp |= n.find("mp_rank_01") != std::string::npos;
  }
  MPT_CHECK(!layer_files, str(tag_dir_, " holds pipeline-engine layer files (layer_XX-model_states.pt)"),
            "Megatron-DeepSpeed pipeline checkpoints are not read yet: convert with DeepSpeed's ds_to_universal first");
  MPT_CHECK(!tp, str(tag_dir_, " holds tensor-parallel files (mp_rank_01...)"), "not read yet");
  MPT_CHECK(!optim.empty(), str(tag_dir_, " has no *_optim_states.pt"), "is it a DeepSpeed ZeRO checkpoint directory?");
  world_ = static_cast<int>(optim.size());
  for (int r = 0; r < world_; ++r) {
    std::string found;
    for (const std::string& n : optim)
      if (n.find(str("zero_pp_rank_", r, "_mp_rank_00_optim_states.pt")) != std::string::npos &&
          (n.rfind("zero_pp", 0) == 0 || n.rfind("bf16_zero_pp", 0) == 0))
        found = n;
    MPT_CHECK(!found.empty(), str(tag_dir_, " has no optim_states file of data-parallel rank ", r),
              "the checkpoint is incomplete (a rank did not save)");
    optim_.push_back(TorchFile::open((t / found).string()));
  }
  const PyValue& o0 = osd_of(optim_[0]);
  stage_ = o0.get("fp32_flat_groups") ? 3 : 2;
  const std::string model = stage_ == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt";
  MPT_CHECK(fs::exists(t / model), str(tag_dir_, " has no ", model), "the checkpoint is incomplete");
  model_states_.push_back(TorchFile::open((t / model).string()));
  const PyValue& ms = model_states_.front().root();
  if (const PyValue* cfg = ms.get("ds_config"))
    if (const PyValue* z = cfg->is_dict() ? cfg->get("zero_optimization") : nullptr)
      if (const PyValue* s = z->is_dict() ? z->get("stage") : nullptr) stage_ = static_cast<int>(s->as_int());
  const PyValue* pc = o0.get("partition_count");
  MPT_CHECK(pc, str(optim_[0].label(), " has no partition_count"), "");
  int64_t parts = 0;
  if (pc->is_sequence()) {
    for (const PyPtr& v : pc->items()) {
      MPT_CHECK(parts == 0 || parts == v->as_int(),
                str(optim_[0].label(), ": parameter groups partitioned over different ranks (MoE)"), "not read yet");
      parts = v->as_int();
    }
  } else {
    parts = pc->as_int();
  }
  MPT_CHECK(parts == world_, str(tag_dir_, ": partition_count ", parts, " but ", world_, " optim_states files"),
            "a rank's file is missing or left from another save");
  const PyValue* frozen = ms.get("frozen_param_shapes");
  MPT_CHECK(!frozen || frozen->is_none() || frozen->size() == 0, str(tag_dir_, " has frozen parameters"), "not read yet");
  // The parameters, in partition order, with their offsets.
  const PyValue& shapes = ms.at("param_shapes");
  const PyValue* pad = stage_ <= 2 ? o0.get("param_alignment_paddings") : nullptr;
  int64_t z3 = 0;
  for (size_t g = 0; g < shapes.size(); ++g) {
    int64_t off = 0, i = 0;
    for (const auto& [k, v] : shapes[g].dict_items()) {
      DeepSpeedParam p;
      p.name = k->as_str();
      for (const PyPtr& d : v->items()) p.shape.push_back(d->as_int());
      p.numel = 1;
      for (int64_t d : p.shape) p.numel *= d;
      p.group = static_cast<int64_t>(g);
      if (stage_ <= 2) {
        p.offset = off;
        off += p.numel;
        if (pad && pad->size() > g && (*pad)[g].size() > static_cast<size_t>(i)) off += (*pad)[g][static_cast<size_t>(i)].as_int();
      } else {
        p.offset = z3;
        z3 += (p.numel + world_ - 1) / world_;
      }
      ++i;
      by_name_[p.name] = params_.size();
      params_.push_back(std::move(p));
    }
  }
  // The consumed sizes must be what the files hold (zero_to_fp32's check).
  for (size_t g = 0; g < shapes.size() && stage_ <= 2; ++g) {
    int64_t avail = 0, used = 0;
    for (int r = 0; r < world_; ++r) avail += flat(r, static_cast<int64_t>(g), "fp32").numel();
    for (const DeepSpeedParam& p : params_)
      if (p.group == static_cast<int64_t>(g)) used = std::max(used, p.offset + p.numel);
    const int64_t align = 2 * world_;
    MPT_CHECK((used + align - 1) / align * align >= avail - align && used <= avail,
              str(tag_dir_, ": group ", g, " lays out ", used, " elements, the partitions hold ", avail),
              "param_shapes and the partitions disagree: is the checkpoint from another model?");
  }
  if (stage_ == 3) {
    int64_t avail = 0;
    const PyValue& groups = osd_of(optim_[0]).at("fp32_flat_groups");
    for (size_t g = 0; g < groups.size(); ++g) avail += flat(0, static_cast<int64_t>(g), "fp32").numel();
    MPT_CHECK(z3 <= avail, str(tag_dir_, ": the parameters need ", z3, " elements per rank, the partitions hold ", avail),
              "param_shapes and the partitions disagree");
  }
}

const DeepSpeedParam& DeepSpeedCheckpoint::param(const std::string& name) const {
  const auto it = by_name_.find(name);
  MPT_CHECK(it != by_name_.end(), str("DeepSpeed checkpoint ", tag_dir_, " has no parameter ", name), "");
  return params_[it->second];
}

const TorchTensor& DeepSpeedCheckpoint::flat(int rank, int64_t group, const std::string& key) const {
  const PyValue& o = osd_of(optim_[static_cast<size_t>(rank)]);
  const PyValue* v = nullptr;
  if (key == "fp32") {
    v = o.get(stage_ <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups");
    MPT_CHECK(v && v->is_sequence() && static_cast<int64_t>(v->size()) > group,
              str(optim_[static_cast<size_t>(rank)].label(), " has no fp32 partition of group ", group), "");
    v = &(*v)[static_cast<size_t>(group)];
  } else {
    const PyValue* base = o.get("base_optimizer_state");
    if (!base) base = o.get("optimizer_state_dict");
    MPT_CHECK(base && base->is_dict(), str(optim_[static_cast<size_t>(rank)].label(), " has no optimizer state"), "");
    const PyValue* st = base->at("state").get(group);
    MPT_CHECK(st && st->is_dict(), str(optim_[static_cast<size_t>(rank)].label(), " has no state of group ", group), "");
    v = st->get(key);
    MPT_CHECK(v, str(optim_[static_cast<size_t>(rank)].label(), ": group ", group, " has no ", key), "only Adam is read");
  }
  MPT_CHECK(v->is_tensor() && v->tensor().shape.size() == 1,
            str(optim_[static_cast<size_t>(rank)].label(), ": ", key, " of group ", group, " is not a flat tensor"), "");
  return v->tensor();
}

void DeepSpeedCheckpoint::read_span(int64_t group, const std::string& key, int64_t begin, int64_t n,
                                    float* dst) const {
  int64_t base = 0;
  for (int r = 0; r < world_ && n > 0; ++r) {
    const TorchTensor& t = flat(r, group, key);
    const int64_t size = t.numel();
    if (begin < base + size) {
      const int64_t lo = begin - base, take = std::min(n, size - lo);
      optim_[static_cast<size_t>(r)].read_f32(t, {lo}, {take}, dst);
      dst += take;
      begin += take;
      n -= take;
    }
    base += size;
  }
  MPT_CHECK(n == 0, str(tag_dir_, ": ", key, " of group ", group, " ends before element ", begin + n), "");
}

std::vector<float> DeepSpeedCheckpoint::read(const std::string& name, const std::string& key) const {
  MPT_CHECK(key == "fp32" || key == "exp_avg" || key == "exp_avg_sq", str("no DeepSpeed state '", key, "'"), "");
  const DeepSpeedParam& p = param(name);
  std::vector<float> out(static_cast<size_t>(p.numel));
  if (stage_ <= 2) {
    read_span(p.group, key, p.offset, p.numel, out.data());
    return out;
  }
  // ZeRO-3: rank r holds elements [r·pn, (r+1)·pn) of the parameter at `offset` of its groups.
  const int64_t pn = (p.numel + world_ - 1) / world_;
  const PyValue& groups = osd_of(optim_[0]).at("fp32_flat_groups");
  for (int r = 0; r < world_; ++r) {
    int64_t at = p.offset, want = std::min(pn, p.numel - r * pn), done = 0, gbase = 0;
    for (size_t g = 0; g < groups.size() && done < want; ++g) {
      const TorchTensor& t = flat(r, static_cast<int64_t>(g), key);
      const int64_t size = t.numel();
      if (at < gbase + size) {
        const int64_t lo = at - gbase, take = std::min(want - done, size - lo);
        optim_[static_cast<size_t>(r)].read_f32(t, {lo}, {take}, out.data() + r * pn + done);
        done += take;
        at += take;
      }
      gbase += size;
    }
    MPT_CHECK(done == std::max<int64_t>(want, 0), str(tag_dir_, ": ", name, "'s ", key, " runs past rank ", r, "'s partition"), "");
  }
  return out;
}

int64_t DeepSpeedCheckpoint::step() const {
  const PyValue& o = osd_of(optim_[0]);
  const PyValue* base = o.get("base_optimizer_state");
  if (!base) base = o.get("optimizer_state_dict");
  const PyValue* st = base ? base->at("state").get(int64_t{0}) : nullptr;
  const PyValue* s = st ? st->get("step") : nullptr;
  MPT_CHECK(s, str(optim_[0].label(), " has no Adam step"), "");
  if (!s->is_tensor()) return s->as_int();
  return static_cast<int64_t>(optim_[0].to_f32(s->tensor()).at(0));
}

}  // namespace mpitron::io
