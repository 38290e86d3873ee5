// tests/io/test_hdf5_file.cpp — Hdf5File (serial driver): every dtype round trip,
// hyperslabs, attributes, listing, and errors that name file and dataset.
#include <doctest/doctest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "io/hdf5_file.h"
#include "tests/io/io_test_util.h"
#include "tests/error_of.h"  // error_of

using namespace mpitron;
using mpitron::testing_util::error_of;
using namespace mpitron::io;
using mpitron::test::ScratchDir;

namespace {

// A (rows, cols) tensor of `dtype` with distinct, sign-mixed values.
Tensor pattern(DType dtype, const Shape& shape, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (static_cast<float>(i) * 0.37f - 5.0f);
  if (is_floating(dtype)) return Tensor::from_vector(v, shape, dtype);
  std::vector<int64_t> iv(v.size());
  for (size_t i = 0; i < v.size(); ++i) iv[i] = dtype == DType::U16 ? static_cast<int64_t>(i * 7 % 65536)
                                                                    : static_cast<int64_t>(i) * 3 - 11;
  if (dtype == DType::I64) iv[0] = int64_t{1} << 40;  // needs all 64 bits
  return Tensor::from_ints(iv, shape, dtype);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("hdf5: every dtype round-trips bit-exactly, whole and by hyperslab") {
  ScratchDir dir("h5_dtypes");
  const std::string path = dir / "t.h5";
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16};
  {
    Hdf5File f = Hdf5File::create(path);
    CHECK_FALSE(f.parallel());
    for (DType t : dtypes) {
      const std::string name = str("group/", dtype_name(t));
      f.create_dataset(name, {5, 7}, elem_type_of(t));
      Tensor x = pattern(t, {5, 7});
      f.write(name, {0, 0}, x.slice(0, 0, 2));   // rows 0-1
      f.write(name, {2, 0}, x.slice(0, 2, 5));   // rows 2-4
    }
    std::vector<double> d = {1.5, -2.25, 1e300, 3.0};
    f.create_dataset("f64", {2, 2}, ElemType::F64);
    f.write_raw("f64", {0, 0}, {2, 2}, d.data(), ElemType::F64);
    f.create_dataset("scalar", {}, ElemType::I64);
    const int64_t s = 42;
    f.write_raw("scalar", {}, {}, &s, ElemType::I64);
    f.close();
  }
  Hdf5File f = Hdf5File::open(path);
  for (DType t : dtypes) {
    CAPTURE(dtype_name(t));
    const std::string name = str("group/", dtype_name(t));
    const DatasetInfo info = f.dataset_info(name);
    CHECK(info.shape == Shape{5, 7});
    CHECK(info.type == elem_type_of(t));
    CHECK(same_bytes(f.read(name), pattern(t, {5, 7})));
    // A column block read back equals the same block of the original.
    Tensor part = f.read(name, {1, 2}, {3, 4});
    CHECK(same_bytes(part, pattern(t, {5, 7}).slice(0, 1, 4).slice(1, 2, 6).contiguous()));
  }
  CHECK(f.attr_string("group/bf16", "mpitron_dtype") == "bf16");
  CHECK(f.attr_string("group/f16", "mpitron_dtype") == "f16");
  CHECK_FALSE(f.has_attr("group/u16", "mpitron_dtype"));
  std::vector<double> d(4);
  f.read_raw("f64", {0, 0}, {2, 2}, d.data(), ElemType::F64);
  CHECK(d == std::vector<double>{1.5, -2.25, 1e300, 3.0});
  CHECK(f.dataset_info("scalar").shape.empty());
  CHECK(f.read("scalar").to_ints() == std::vector<int64_t>{42});
  CHECK(f.list_datasets() == std::vector<std::string>{"f64", "group/bf16", "group/f16", "group/f32", "group/i32",
                                                      "group/i64", "group/u16", "scalar"});
  CHECK(f.has_dataset("group/f32"));
  CHECK_FALSE(f.has_dataset("group"));        // a group, not a dataset
  CHECK_FALSE(f.has_dataset("nope/x"));
  CHECK(f.data_file_offset("group/f32") > 0);  // contiguous layout
}

TEST_CASE("hdf5: attributes on the file and on datasets") {
  ScratchDir dir("h5_attrs");
  const std::string path = dir / "a.h5";
  nlohmann::json flags = {{"lr", 3e-4}, {"layers", 12}, {"name", "gpt-ü"}, {"list", {1, 2, 3}}};
  std::string big(100000, 'x');  // over HDF5's 64 KiB compact attribute limit
  {
    Hdf5File f = Hdf5File::create(path);
    f.set_attr_string("/", "format", "mpitron-test");
    f.set_attr_int("", "iteration", -7);
    f.set_attr_double("/", "loss_scale", 65536.5);
    f.set_attr_json("/", "flags", flags);
    f.set_attr_string("/", "big", big);
    f.set_attr_string("/", "empty", "");
    f.create_dataset("w", {3}, ElemType::F32);
    f.write("w", {0}, Tensor::from_vector({1, 2, 3}, {3}));
    f.set_attr_int("w", "n", 3);
    f.set_attr_int("w", "n", 4);  // overwrite
    f.close();
  }
  Hdf5File f = Hdf5File::open(path);
  CHECK(f.attr_string("/", "format") == "mpitron-test");
  CHECK(f.attr_int("/", "iteration") == -7);
  CHECK(f.attr_double("/", "loss_scale") == 65536.5);
  CHECK(f.attr_json("/", "flags") == flags);
  CHECK(f.attr_string("/", "big") == big);
  CHECK(f.attr_string("/", "empty").empty());
  CHECK(f.attr_int("w", "n") == 4);
  CHECK(f.has_attr("/", "flags"));
  CHECK_FALSE(f.has_attr("/", "nope"));
  const auto names = f.attr_names("/");
  CHECK(std::find(names.begin(), names.end(), "loss_scale") != names.end());
}

TEST_CASE("hdf5: failures are mpitron errors naming the file, object and operation") {
  ScratchDir dir("h5_errors");
  const std::string missing = dir / "missing.h5";
  std::string e = error_of([&] { Hdf5File::open(missing); });
  CHECK(e.find("H5Fopen") != std::string::npos);
  CHECK(e.find(missing) != std::string::npos);

  const std::string path = dir / "e.h5";
  Hdf5File f = Hdf5File::create(path);
  f.create_dataset("w", {4, 4}, ElemType::F32);
  e = error_of([&] { f.read("nope"); });
  CHECK(e.find("'nope'") != std::string::npos);
  CHECK(e.find(path) != std::string::npos);
  e = error_of([&] { f.create_dataset("w", {4, 4}, ElemType::F32); });
  CHECK(e.find("H5Dcreate") != std::string::npos);
  CHECK(e.find("'w'") != std::string::npos);
  e = error_of([&] { f.write("w", {2, 0}, Tensor::zeros({3, 4}, DType::F32)); });  // rows 2..4 of 4
  CHECK(e.find("outside the dataset shape") != std::string::npos);
  e = error_of([&] { f.write("w", {0, 0}, Tensor::zeros({4, 4}, DType::BF16)); });
  CHECK(e.find("dataset holds f32, buffer is bf16") != std::string::npos);
  e = error_of([&] { f.attr_int("w", "absent"); });
  CHECK(e.find("absent") != std::string::npos);
  // A file that is not HDF5 at all.
  const std::string junk = dir / "junk.h5";
  { std::FILE* j = std::fopen(junk.c_str(), "wb"); std::fputs("not hdf5", j); std::fclose(j); }
  e = error_of([&] { Hdf5File::open(junk); });
  CHECK(e.find(junk) != std::string::npos);
}
