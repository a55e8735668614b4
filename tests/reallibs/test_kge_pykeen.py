"""PyKEEN's knowledge-graph embedding models over a small labeled graph made in place: TransE
and DistMult (uniform and normal initializers with normalizing constrainers), RotatE (complex
embeddings initialized by unit-modulus phases) and ComplEx, ConvE (a 2-D convolution over
reshaped embeddings, batch norms), TuckER (a core tensor), the R-GCN with basis decomposition
(edge weights from the graph) and CompGCN, NodePiece (entities tokenized by anchors and
relations); one model seeds torch itself (`random_seed`), as PyKEEN's pipeline does.

PyKEEN's class-resolver collects the subclasses of torch's LR schedulers by name when it is
imported, and refuses MONAI's ExponentialLR beside torch's: this file's name sorts it before
test_monai.py, so pytest imports PyKEEN first."""

import numpy as np
import torch
from harness import library_tests
from pykeen.models import (RGCN, CompGCN, ComplEx, ConvE, DistMult, NodePiece, RotatE, TransE,
                           TuckER)
from pykeen.triples import TriplesFactory

_TRIPLES = np.array([[f"e{h}", f"r{(h * 7 + t) % 3}", f"e{t}"]
                     for h in range(8) for t in range(8) if (h * 5 + t * 3) % 4 == 0], dtype=str)


def _factory(inverse=False):
    return TriplesFactory.from_labeled_triples(_TRIPLES, create_inverse_triples=inverse)


CASES = {
    "pykeen/transe-distmult": lambda: torch.nn.ModuleList([
        TransE(triples_factory=_factory(), embedding_dim=16, scoring_fct_norm=1),
        DistMult(triples_factory=_factory(), embedding_dim=16)]),
    "pykeen/rotate-complex": lambda: torch.nn.ModuleList([
        RotatE(triples_factory=_factory(), embedding_dim=8),
        ComplEx(triples_factory=_factory(), embedding_dim=8)]),
    "pykeen/conve-tucker-seeded": lambda: torch.nn.ModuleList([
        ConvE(triples_factory=_factory(inverse=True), embedding_dim=16, output_channels=4,
              embedding_height=4, embedding_width=4, kernel_height=3, kernel_width=3),
        TuckER(triples_factory=_factory(), embedding_dim=8, relation_dim=4, random_seed=7)]),
    "pykeen/rgcn-compgcn": lambda: torch.nn.ModuleList([
        RGCN(triples_factory=_factory(), embedding_dim=8, num_layers=2,
             decomposition="bases", decomposition_kwargs=dict(num_bases=2)),
        CompGCN(triples_factory=_factory(inverse=True), embedding_dim=8,
                encoder_kwargs=dict(num_layers=2))]),
    "pykeen/nodepiece": lambda: NodePiece(
        triples_factory=_factory(inverse=True), embedding_dim=8, num_tokens=[3, 2],
        tokenizers=["AnchorTokenizer", "RelationTokenizer"],
        tokenizers_kwargs=[dict(selection_kwargs=dict(num_anchors=3)), dict()]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
