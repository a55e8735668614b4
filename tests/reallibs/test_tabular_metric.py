"""Tabular and metric-learning model code: rtdl's FT-Transformer (feature tokenizers with
uniform init scaled by the embedding width, a CLS token, ReGLU blocks), its MLP and ResNet with
batch norms, and pytorch-metric-learning's losses that own parameters (ArcFace and CosFace
class weights, SubCenter ArcFace, ProxyAnchor's Kaiming-normal proxies, SoftTriple centers,
Large-Margin Softmax's binomial coefficient buffers, and a trainable cross-batch memory)."""

import torch
from harness import library_tests
from pytorch_metric_learning import losses
from rtdl_revisiting_models import MLP, FTTransformer, ResNet

CASES = {
    "rtdl-revisiting-models/ft-transformer": lambda: FTTransformer(
        n_cont_features=4, cat_cardinalities=[3, 5], d_out=2,
        **FTTransformer.get_default_kwargs(n_blocks=2)),
    "rtdl-revisiting-models/mlp-resnet": lambda: torch.nn.ModuleList([
        MLP(d_in=6, d_out=2, n_blocks=2, d_block=16, dropout=0.1),
        ResNet(d_in=6, d_out=2, n_blocks=2, d_block=16, d_hidden=None,
               d_hidden_multiplier=2.0, dropout1=0.1, dropout2=0.0)]),
    "pytorch-metric-learning/margin-losses": lambda: torch.nn.ModuleList([
        losses.ArcFaceLoss(num_classes=7, embedding_size=16),
        losses.CosFaceLoss(num_classes=7, embedding_size=16),
        losses.SubCenterArcFaceLoss(num_classes=7, embedding_size=16, sub_centers=3),
        losses.LargeMarginSoftmaxLoss(num_classes=7, embedding_size=16, margin=4),
        losses.SphereFaceLoss(num_classes=7, embedding_size=16)]),
    "pytorch-metric-learning/proxy-losses": lambda: torch.nn.ModuleList([
        losses.ProxyAnchorLoss(num_classes=7, embedding_size=16),
        losses.ProxyNCALoss(num_classes=7, embedding_size=16),
        losses.SoftTripleLoss(num_classes=7, embedding_size=16, centers_per_class=3),
        losses.NormalizedSoftmaxLoss(num_classes=7, embedding_size=16),
        losses.CrossBatchMemory(losses.ContrastiveLoss(), embedding_size=16, memory_size=32)]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
