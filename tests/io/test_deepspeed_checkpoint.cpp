// io/deepspeed_checkpoint.h on the committed DeepSpeed 0.19.8 runs (tests/io/ref/torch/ds_zero{1,2,3},
// written by tests/reference/torch_checkpoint_ref.py: 2 gloo ranks, bf16, AdamW, 2 steps): the
// fp32 master weights reassembled from the ZeRO partitions equal DeepSpeed's own zero_to_fp32.py
// output (zero_to_fp32.safetensors) bit for bit, and the weights and Adam moments equal DeepSpeed's
// universal-checkpoint conversion (ds_to_universal: universal/zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt).
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "io/deepspeed_checkpoint.h"
#include "io/safetensors.h"
#include "io/torch_checkpoint.h"
#include "tests/error_of.h"

using namespace mpitron;
using namespace mpitron::io;
using mpitron::testing_util::error_of;

namespace {
std::string ref(int stage) { return std::string(MPITRON_SOURCE_DIR) + "/tests/io/ref/torch/ds_zero" + std::to_string(stage); }

int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}
}  // namespace

TEST_CASE("DeepSpeed ZeRO-1/2/3: weights equal zero_to_fp32.py's, weights and moments the universal conversion's") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    const DeepSpeedCheckpoint ck(ref(stage));
    CHECK(ck.zero_stage() == stage);
    CHECK(ck.world_size() == 2);
    CHECK(ck.step() == 2);
    REQUIRE(ck.params().size() == 17);
    const Safetensors fp32 = read_safetensors(ref(stage) + "/zero_to_fp32.safetensors");
    size_t compared = 0;
    for (const DeepSpeedParam& p : ck.params()) {
      CAPTURE(p.name);
      REQUIRE(fp32.has(p.name));
      const std::vector<float> w = ck.read(p.name, "fp32");
      CHECK(differing(w, fp32.to_f32(p.name).to_floats()) == 0);
      const std::string uni = ref(stage) + "/universal/zero/" + p.name + "/";
      REQUIRE(std::filesystem::exists(uni + "fp32.pt"));
      for (const char* key : {"fp32", "exp_avg", "exp_avg_sq"}) {
        const TorchFile f = TorchFile::open(uni + key + ".pt");
        const PyValue& root = f.root();
        const PyValue& t = root.is_tensor() ? root : root.at("param");
        CHECK_MESSAGE(differing(ck.read(p.name, key), f.to_f32(t.tensor())) == 0, key);
      }
      ++compared;
    }
    CHECK(compared == fp32.tensors.size());
  }
}

TEST_CASE("DeepSpeed: what is not read is refused by name") {
  CHECK(error_of([] { DeepSpeedCheckpoint(ref(1)).read("nope.weight", "fp32"); }).find("nope.weight") !=
        std::string::npos);
  CHECK(error_of([] { DeepSpeedCheckpoint(ref(1)).read("wte.weight", "momentum"); }).find("momentum") !=
        std::string::npos);
  CHECK(error_of([] { DeepSpeedCheckpoint(std::string(MPITRON_SOURCE_DIR) + "/tests/io/ref/torch/mcore_gpt2"); })
            .find("optim_states") != std::string::npos);
}
