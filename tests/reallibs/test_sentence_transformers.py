"""sentence-transformers, from modules built locally (no download): a SentenceTransformer of a
static embedding over a word-level tokenizer made in place, a dense projection and a normalizer;
its LSTM, CNN, weighted layer pooling, layer norm and pooling modules."""

import torch
from harness import library_tests
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import (CNN, LSTM, Dense, LayerNorm,
                                                                Normalize, Pooling,
                                                                StaticEmbedding,
                                                                WeightedLayerPooling)
from tokenizers import Tokenizer, models, pre_tokenizers


def _tokenizer():
    vocab = {f"w{i}": i for i in range(100)}
    vocab["[UNK]"] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


CASES = {
    "sentence-transformers/static-dense-normalize": lambda: SentenceTransformer(
        modules=[StaticEmbedding(_tokenizer(), embedding_dim=32), Dense(32, 16), Normalize()],
        device="cpu"),
    "sentence-transformers/lstm-cnn-pooling": lambda: torch.nn.ModuleList([
        LSTM(32, 16, num_layers=2), CNN(32, 8, kernel_sizes=[1, 3]),
        WeightedLayerPooling(32, num_hidden_layers=4), LayerNorm(32),
        Pooling(32, pooling_mode="mean")]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
