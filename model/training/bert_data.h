// model/training/bert_data.h — pretrain_bert's (and pretrain_t5's) samples from Megatron sentence data:
// --data-path PREFIX (a `preprocess_data --split-sentences` dataset,
// PREFIX = <output-prefix>_text_sentence) cut into train / valid / test documents by
// --split, or --train-data-path / --valid-data-path / --test-data-path, one
// prefix each. Each split is a data::BertDataset (data/bert_dataset.h) with the
// sample count the run needs: Megatron's masked samples, sentence order, padding.
// A weighted blend of several prefixes is refused (not implemented for BERT).
#pragma once
#include <memory>

#include "model/training/trainer.h"

namespace mpitron {

namespace data {
class TextTokenizer;
}

// tok must be a WordPiece tokenizer (BertWordPieceLowerCase / BertWordPieceCase);
// --mask-prob, --short-seq-prob, --seed and the binary-head choice come from args.
std::shared_ptr<SampleSource> make_bert_data(const TrainArgs& args, const data::TextTokenizer& tok);
// pretrain_t5's: a data::T5Dataset (data/t5_dataset.h) per split, Megatron's span corruption, with
// --vocab-extra-ids sentinels, the encoder and decoder lengths of args.model.
std::shared_ptr<SampleSource> make_t5_data(const TrainArgs& args, const data::TextTokenizer& tok);

}  // namespace mpitron
