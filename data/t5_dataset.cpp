// data/t5_dataset.cpp — T5 span-corruption samples (rules in the header).
#include "data/t5_dataset.h"

#include <string>

#include "core/error.h"
#include "data/masked_dataset.h"
#include "data/wordpiece_tokenizer.h"

namespace mpitron::data {

T5Vocab T5Vocab::from(const TextTokenizer& tok, int64_t extra_ids) {
  const WordPieceTokenizer& wp = wordpiece_of(tok, "T5");
  MPT_CHECK(extra_ids > 0, str("T5 span corruption needs sentinel tokens: --vocab-extra-ids is ", extra_ids),
            "pass --vocab-extra-ids 100 (Megatron's pretrain_t5 setting)");
  T5Vocab v;
  v.cls = wp.cls(), v.sep = wp.sep(), v.mask = wp.mask(), v.pad = wp.pad(), v.bos = wp.bos(), v.eos = wp.eod();
  MPT_CHECK(v.mask >= 0 && v.pad >= 0 && v.bos >= 0 && v.eos >= 0,
            "the WordPiece vocabulary lacks [MASK] or [PAD] (T5 span corruption writes them)", "use a BERT vocab.txt");
  v.vocab_size = wp.vocab_size();
  for (int64_t j = 0; j < extra_ids; ++j) {  // Megatron's add_token: an absent token gets the next id
    const int32_t id = wp.token_to_id("<extra_id_" + std::to_string(j) + ">");
    v.sentinels.push_back(id >= 0 ? id : static_cast<int32_t>(v.vocab_size++));
  }
  v.continuation = continuation_table(wp);
  v.continuation.resize(static_cast<size_t>(v.vocab_size), 0);  // the appended sentinels are whole words
  return v;
}

T5Dataset::T5Dataset(std::shared_ptr<const IndexedDataset> data, DocRange docs, T5Vocab vocab, const T5DatasetConfig& cfg)
    : data_(std::move(data)), docs_(docs), vocab_(std::move(vocab)), cfg_(cfg) {
  MPT_CHECK(cfg_.encoder_seq_length >= 4, str("T5 --encoder-seq-length ", cfg_.encoder_seq_length, " is too short"),
            "use 512 (Megatron's pretrain_t5) or at least 4");
  MPT_CHECK(cfg_.decoder_seq_length >= 2, str("T5 --decoder-seq-length ", cfg_.decoder_seq_length, " is too short"),
            "use 128 (Megatron's pretrain_t5) or at least 2");
  check_masked_dataset("T5", cfg_.mask_prob, cfg_.short_seq_prob, cfg_.seed, cfg_.max_ngram, *data_, docs_,
                       vocab_.vocab_size);
  MPT_CHECK(!vocab_.sentinels.empty() && vocab_.mask >= 0 && vocab_.pad >= 0 && vocab_.bos >= 0 && vocab_.eos >= 0 &&
                static_cast<int64_t>(vocab_.continuation.size()) == vocab_.vocab_size,
            "T5Vocab lacks sentinels, [MASK], [PAD], [BOS] / [EOS] or its continuation table", "build it with T5Vocab::from");
  rows_ = build_sentence_rows(*data_, docs_, static_cast<int32_t>(cfg_.encoder_seq_length - 2), 1, cfg_.short_seq_prob,
                              cfg_.seed, cfg_.num_samples, "T5", "check the data path");
}

T5Sample T5Dataset::sample(int64_t index) const {
  MPT_CHECK(index >= 0 && index < size(), str("T5 sample ", index, " out of range [0, ", size(), ")"), "");
  const auto [beg, end, target] = rows_[static_cast<size_t>(index)];
  NumpyRandomState rs(static_cast<uint32_t>((static_cast<uint64_t>(cfg_.seed) + static_cast<uint64_t>(index)) & 0xFFFFFFFFull));
  std::vector<int32_t> tokens;
  for (int64_t s = beg; s < end; ++s) data_->get(s).append_to(tokens);
  T5Sample out;
  out.truncated = static_cast<int64_t>(tokens.size()) > target;
  if (out.truncated) tokens.resize(static_cast<size_t>(target));

  SpanMasking sm;
  sm.mask_prob = cfg_.mask_prob;
  sm.max_ngram = cfg_.max_ngram;
  sm.whole_word = cfg_.whole_word;
  sm.geometric = cfg_.geometric;
  const MaskedSpans ms =
      mask_spans(tokens, target, vocab_.continuation, vocab_.cls, vocab_.sep, sm, rs, [&](int32_t) { return vocab_.mask; });
  MPT_CHECK(ms.spans.size() <= vocab_.sentinels.size(),
            str("T5 sample ", index, " masks ", ms.spans.size(), " spans but --vocab-extra-ids gives ",
                vocab_.sentinels.size(), " sentinels"),
            "raise --vocab-extra-ids (100 is Megatron's) or lower --mask-prob");

  // Each span → its sentinel in the encoder; sentinel + the span's tokens on the decoder side.
  std::vector<int32_t> enc, dec{vocab_.bos}, lab;
  size_t from = 0;
  for (size_t j = 0; j < ms.spans.size(); ++j) {
    const std::vector<int32_t>& span = ms.spans[j];
    const int32_t s = vocab_.sentinels[j];
    enc.insert(enc.end(), ms.tokens.begin() + static_cast<std::ptrdiff_t>(from), ms.tokens.begin() + span.front());
    enc.push_back(s);
    dec.push_back(s);
    lab.push_back(s);
    for (const int32_t p : span) {
      dec.push_back(tokens[static_cast<size_t>(p)]);
      lab.push_back(tokens[static_cast<size_t>(p)]);
    }
    from = static_cast<size_t>(span.back()) + 1;
  }
  enc.insert(enc.end(), ms.tokens.begin() + static_cast<std::ptrdiff_t>(from), ms.tokens.end());
  lab.push_back(vocab_.eos);
  const size_t E = static_cast<size_t>(cfg_.encoder_seq_length), D = static_cast<size_t>(cfg_.decoder_seq_length);
  MPT_CHECK(enc.size() <= E, str("T5 sample ", index, " has ", enc.size(), " encoder tokens > --encoder-seq-length ", E), "");
  MPT_CHECK(dec.size() <= D,
            str("T5 sample ", index, " needs ", dec.size(), " decoder tokens ([BOS], sentinels and masked spans) > ",
                "--decoder-seq-length ", D),
            "raise --decoder-seq-length (Megatron: 128 for --encoder-seq-length 512) or lower --mask-prob");
  const size_t dec_len = dec.size();
  out.text_enc = std::move(enc);
  out.text_enc.resize(E, vocab_.pad);
  out.text_dec = std::move(dec);
  out.text_dec.resize(D, vocab_.pad);
  out.labels = std::move(lab);
  out.labels.resize(D, -1);
  out.loss_mask.assign(D, 0);
  for (size_t i = 0; i < dec_len; ++i) out.loss_mask[i] = 1;
  out.enc_mask.assign(E, 1);
  out.dec_mask.assign(D, 1);
  for (size_t i = 0; i < E; ++i)
    if (out.text_enc[i] == vocab_.pad) out.enc_mask[i] = 0, out.text_enc[i] = 0;
  for (size_t i = 0; i < D; ++i) {
    if (out.text_dec[i] == vocab_.pad) out.dec_mask[i] = 0, out.text_dec[i] = 0;
    if (out.labels[i] == vocab_.pad) out.labels[i] = 0;
  }
  return out;
}

}  // namespace mpitron::data
