// apps/merge_datasets.cpp — concatenate Megatron datasets (tools/merge_datasets.py):
//   merge_datasets --input dir_with_bin_idx --output-prefix out/merged
//   merge_datasets --input a_text_document b_text_document --output-prefix out/merged
// A directory contributes every <name>.idx that has a <name>.bin beside it, in
// name order. All inputs must have the same dtype. `.bin` bytes are
// concatenated; the index takes every sequence and document (megatron-core
// IndexedDatasetBuilder.add_index), so the result equals megatron-core's.
#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "data/indexed_dataset.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace mpitron;
using namespace mpitron::data;

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  std::string output;
  po::options_description desc("merge_datasets: concatenate .bin/.idx datasets of one dtype");
  desc.add_options()("help,h", "show this help")(
      "input", po::value(&inputs)->multitoken()->required(),
      "a directory holding <name>.bin/.idx pairs, or dataset prefixes")(
      "output-prefix", po::value(&output)->required(), "writes <prefix>.bin/.idx");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
    std::vector<std::string> prefixes;
    for (const auto& in : inputs) {
      if (fs::is_directory(in)) {
        std::vector<std::string> found;
        for (const auto& e : fs::directory_iterator(in)) {
          if (e.path().extension() != ".idx") continue;
          fs::path prefix = e.path();
          prefix.replace_extension();
          MPT_CHECK(fs::exists(bin_path(prefix.string())),
                    str("'", e.path().string(), "' has no matching .bin in '", in, "'"), "");
          found.push_back(prefix.string());
        }
        std::sort(found.begin(), found.end());
        MPT_CHECK(!found.empty(), str("no .idx/.bin pairs in directory '", in, "'"), "");
        prefixes.insert(prefixes.end(), found.begin(), found.end());
      } else {
        std::string p = in;
        if (p.size() > 4 && (p.substr(p.size() - 4) == ".bin" || p.substr(p.size() - 4) == ".idx"))
          p.resize(p.size() - 4);
        prefixes.push_back(p);
      }
    }
    for (const auto& p : prefixes)
      MPT_CHECK(fs::absolute(p) != fs::absolute(output), str("input '", p, "' is also the output prefix"), "");
    // Check every input (and the dtype match) before writing anything.
    DType dtype = DType::U16;
    for (size_t i = 0; i < prefixes.size(); ++i) {
      IndexedDataset ds(prefixes[i]);
      if (i == 0) dtype = ds.dtype();
      MPT_CHECK(ds.dtype() == dtype,
                str("cannot merge: '", prefixes[i], "' holds ", dtype_name(ds.dtype()), " but '", prefixes[0],
                    "' holds ", dtype_name(dtype)),
                "all inputs must come from the same tokenizer (same token dtype)");
    }
    IndexedDatasetWriter w(output, dtype);
    for (const auto& p : prefixes) w.add_index(p);
    w.finalize();
    std::cerr << "merged " << prefixes.size() << " datasets (" << w.document_count() << " documents, "
              << w.sequence_count() << " sequences, " << dtype_name(dtype) << ") into " << output << ".{bin,idx}\n";
    return 0;
  } catch (const po::error& e) {
    std::cerr << "merge_datasets: " << e.what() << "\n(see --help)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "merge_datasets: " << e.what() << "\n";
    return 1;
  }
}
