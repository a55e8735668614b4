"""PyTorch Geometric: its GNN models (GCN, GAT, GraphSAGE, GIN, PNA, SchNet, Graph U-Net,
AttentiveFP) and a zoo of its message-passing layers (glorot and zeros inits, per-relation bases,
edge features, learnable temperatures); BasicGNN deep-copies its normalization layer per layer;
lazy layers (in_channels=-1) learn their shapes from a forward while the model is built, and
to_hetero rewrites a model per node and edge type with torch.fx."""

import torch
import torch_geometric.nn as gnn
from harness import library_tests
from torch_geometric.nn import models, to_hetero

def _lazy_with_forward():
    convs = torch.nn.ModuleList([gnn.GCNConv(-1, 16), gnn.SAGEConv((-1, -1), 8),
                                 gnn.GATConv(-1, 4, heads=2)])
    models_ = models.GCN(-1, 16, num_layers=2, norm="batch_norm")
    x, edges = torch.randn(5, 7), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    for conv in convs:
        conv(x, edges)
    models_(x, edges)  # train mode: the batch norms update their running statistics
    return torch.nn.ModuleList([convs, models_])


def _hetero():
    metadata = (["paper", "author"], [("paper", "cites", "paper"), ("author", "writes", "paper"),
                                      ("paper", "rev_writes", "author")])
    return to_hetero(models.GraphSAGE(16, 32, 2, out_channels=8, norm="batch_norm"), metadata)


CASES = {
    "torch-geometric/gcn-batchnorm-jk": lambda: models.GCN(16, 32, num_layers=3, out_channels=8,
                                                           norm="batch_norm", jk="cat"),
    "torch-geometric/gatv2-edge-features": lambda: models.GAT(16, 32, num_layers=2, heads=4,
                                                              out_channels=8, v2=True, edge_dim=3),
    "torch-geometric/sage-gin-pna": lambda: torch.nn.ModuleList([
        models.GraphSAGE(16, 32, 2, aggr="lstm", norm="layer_norm"), models.GIN(16, 32, 2),
        models.PNA(16, 32, 2, aggregators=["mean", "max"],
                   scalers=["identity", "amplification"], deg=torch.tensor([0, 3, 5, 2]))]),
    "torch-geometric/conv-zoo": lambda: torch.nn.ModuleList([
        gnn.TransformerConv(16, 8, heads=2, edge_dim=4, beta=True),
        gnn.RGCNConv(16, 8, num_relations=3, num_bases=2), gnn.ChebConv(16, 8, K=3),
        gnn.GatedGraphConv(16, 3), gnn.NNConv(4, 8, torch.nn.Linear(3, 32)),
        gnn.GENConv(16, 16, aggr="softmax", learn_t=True), gnn.SuperGATConv(16, 8, heads=2),
        gnn.FiLMConv(16, 8), gnn.GPSConv(16, gnn.GINConv(torch.nn.Linear(16, 16)), heads=2)]),
    "torch-geometric/schnet": lambda: models.SchNet(hidden_channels=32, num_filters=32,
                                                    num_interactions=2, num_gaussians=20),
    "torch-geometric/graph-unet": lambda: models.GraphUNet(16, 32, 8, depth=2),
    "torch-geometric/attentivefp": lambda: models.AttentiveFP(16, 32, 8, edge_dim=4, num_layers=2,
                                                              num_timesteps=2),
    "torch-geometric/mlp-lightgcn-set2set": lambda: torch.nn.ModuleList([
        models.MLP([16, 32, 8], norm="batch_norm"), models.LightGCN(100, 16, 2),
        gnn.Set2Set(16, 2)]),
    "torch-geometric/lazy-with-forward": _lazy_with_forward,
    "torch-geometric/to-hetero": _hetero,
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
