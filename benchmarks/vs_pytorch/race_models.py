"""The models of benchmarks/vs_pytorch's PyTorch side: memtrain's own (the
feature MLP, the small CNN, the residual 3D U-Net, written module for
module after src/model with memtrain's parameter names, and its Dice + CE
loss), the seeds' models from their own frameworks (timm's SE-ResNeXt50,
MONAI's SwinUNETR, open_clip's CLIP with its ClipLoss), whose parameter
names memtrain's are, and FS-CT as its official code lays it out (not a
package: its modules and names, mapped to memtrain's) on timm's ResNet-50."""

import torch
import torch.nn as nn
import torch.nn.functional as F

DICE_EPS = 1e-5  # memtrain's kDiceEps (include/memtrain/model/losses.h)

# ------------------------------------------------------------------ models


def groups_for(channels):
    for g in range(8, 1, -1):
        if channels % g == 0:
            return g
    return 1


class MlpBlock(nn.Module):
    def __init__(self, width, norm):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.norm = nn.GroupNorm(groups_for(4 * width), 4 * width) if norm else None

    def forward(self, x):
        h = self.fc1(x)
        if self.norm is not None:
            h = self.norm(h.float())
        return x + self.fc2(torch.relu(h))


class FeatureMlp(nn.Module):
    def __init__(self, features, hidden, depth, classes, norm):
        super().__init__()
        self.input = nn.Linear(features, hidden)
        self.blocks = nn.ModuleList([MlpBlock(hidden, norm) for _ in range(depth)])
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = torch.relu(self.input(x))
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class ConvStage(nn.Module):
    def __init__(self, cin, cout, norm, pool):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.GroupNorm(groups_for(cout), cout) if norm else None
        self.pool = pool

    def forward(self, x):
        h = self.conv(x)
        if self.norm is not None:
            h = self.norm(h.float())
        h = torch.relu(h)
        return F.max_pool2d(h, 2) if self.pool else h


class SmallCnn(nn.Module):
    def __init__(self, shape, width, depth, classes, norm):
        super().__init__()
        self.stem = nn.Conv2d(shape[0], width, 3, padding=1)
        stages, ch, h, w = [], width, shape[1], shape[2]
        for _ in range(depth):
            pool = h >= 2 and w >= 2
            stages.append(ConvStage(ch, 2 * ch, norm, pool))
            ch *= 2
            if pool:
                h, w = h // 2, w // 2
        self.stages = nn.ModuleList(stages)
        self.head = nn.Linear(ch, classes)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for s in self.stages:
            x = s(x)
        return self.head(F.adaptive_avg_pool2d(x, (1, 1)).flatten(1))


def make_norm3d(kind, channels):
    if kind == "instance":
        return nn.InstanceNorm3d(channels, affine=True)
    if kind == "group":
        return nn.GroupNorm(groups_for(channels), channels)
    return None


class ResBlock(nn.Module):
    def __init__(self, cin, cout, norm):
        super().__init__()
        has_norm = norm != "none"
        self.conv1 = nn.Conv3d(cin, cout, 3, padding=1, bias=not has_norm)
        self.norm1 = make_norm3d(norm, cout)
        self.conv2 = nn.Conv3d(cout, cout, 3, padding=1, bias=not has_norm)
        self.norm2 = make_norm3d(norm, cout)
        self.proj = nn.Conv3d(cin, cout, 1) if cin != cout else None

    @staticmethod
    def normed(norm, h):
        return h if norm is None else norm(h.float())

    def forward(self, x):
        h = torch.relu(self.normed(self.norm1, self.conv1(x)))
        h = self.normed(self.norm2, self.conv2(h))
        return torch.relu(h + (self.proj(x) if self.proj is not None else x))


class UNet3d(nn.Module):
    def __init__(self, in_channels, feature_size, depth, classes, norm):
        super().__init__()
        f = feature_size
        self.depth = depth
        self.enc = nn.ModuleList(
            [ResBlock(in_channels if l == 0 else f << (l - 1), f << l, norm) for l in range(depth)]
        )
        self.up = nn.ModuleList(
            [nn.ConvTranspose3d(f << (l + 1), f << l, 2, stride=2) for l in range(depth - 1)]
        )
        self.dec = nn.ModuleList([ResBlock(2 * (f << l), f << l, norm) for l in range(depth - 1)])
        self.head = nn.Conv3d(f, classes, 1)

    def forward(self, x):
        skips = []
        for l in range(self.depth):
            x = self.enc[l](x if l == 0 else F.max_pool3d(x, 2))
            if l + 1 < self.depth:
                skips.append(x)
        for l in range(self.depth - 2, -1, -1):
            x = self.dec[l](torch.cat([self.up[l](x), skips[l]], 1))
        return self.head(x)


def dice_ce_loss_sum(logits, target):
    """memtrain's dice_ce_loss_sum (src/model/losses.cpp), op for op."""
    voxels = [2, 3, 4]
    logp = torch.log_softmax(logits.float(), 1)
    index = target.unsqueeze(1)
    ce = -logp.gather(1, index).mean(voxels).squeeze(1)
    p = logp.exp()
    g = torch.zeros_like(p).scatter_(1, index, 1.0)
    inter = (p * g).sum(voxels)
    dice = (2.0 * inter + DICE_EPS) / (p.sum(voxels) + g.sum(voxels) + DICE_EPS)
    return (ce + (1.0 - dice.mean(1))).sum()


# ------------------------------------------------------------ peers' models


def swin_unetr(in_channels, classes, feature_size):
    """MONAI's SwinUNETR with MONAI's defaults (memtrain's swin_unetr is it,
    module for module: Note [SwinUNETR as MONAI])."""
    from monai.networks.nets import SwinUNETR

    return SwinUNETR(in_channels=in_channels, out_channels=classes, feature_size=feature_size)


def open_clip_model(variant, image_size):
    """open_clip's CLIP of `variant` (ViT-B-32, ...; -quickgelu) for
    image_size^2 images, as memtrain's model.name clip builds it."""
    import open_clip
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg

    quick = variant.endswith("-quickgelu")
    base = variant[: -len("-quickgelu")] if quick else variant
    if base == "tiny":  # memtrain's model.variant tiny (tests, CI sizes)
        return open_clip.CLIP(
            embed_dim=32,
            vision_cfg=CLIPVisionCfg(image_size=image_size, patch_size=8, width=64, layers=2, head_width=16),
            text_cfg=CLIPTextCfg(width=64, heads=4, layers=2),
            quick_gelu=quick,
        )
    cfg = open_clip.get_model_config(base)
    cfg["vision_cfg"]["image_size"] = image_size
    return open_clip.CLIP(**cfg, quick_gelu=quick)


class ClipStep:
    """open_clip's ClipLoss over the world's batch: each rank's rows against
    every rank's (local_loss, gather_with_grad), so that DDP's average of
    the ranks' gradients is the gradient of the one-batch loss, memtrain's
    exact contrastive loss of a window (Note [Exact contrastive
    accumulation]). __call__ returns the rank's mean loss and its rows."""

    def __init__(self, rank, world):
        import open_clip

        self.loss = open_clip.ClipLoss(
            local_loss=world > 1, gather_with_grad=world > 1, rank=rank, world_size=world
        )

    def __call__(self, model, x, tokens):
        image, text, scale = model(x, tokens)
        return self.loss(image, text, scale), x.shape[0]


# ------------------------------------------------------------------ FS-CT
# The few-shot cosine transformer (variant "cosine") as the official code
# lays it out (github.com/vinuni-vishc/Few-Shot-Cosine-Transformer,
# methods/transformer.py and backbone.py's CosineDistLinear), one episode
# at a time; tests/peers/fsct_reference.py runs it in float64 against
# memtrain's head (ARCHITECTURE.md, Note [The few-shot cosine transformer]).


def cosine_distance(x1, x2):
    """x1 (h, a, n, d), x2 (h, b, d, m) -> (h, max(a, b), n, m): cosines."""
    dots = torch.matmul(x1, x2)
    return dots / (torch.norm(x1, dim=-1, keepdim=True) * torch.norm(x2, dim=-2, keepdim=True))


class FsctAttention(nn.Module):
    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads = heads
        self.input_linear = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, heads * dim_head, bias=False))
        project = not (heads == 1 and dim_head == dim)
        self.output_linear = nn.Linear(heads * dim_head, dim) if project else nn.Identity()

    def forward(self, q, k, v):
        def split(t):  # 'q n (h d) -> h q n d'
            t = self.input_linear(t)
            return t.view(t.shape[0], t.shape[1], self.heads, -1).permute(2, 0, 1, 3)

        f_q, f_k, f_v = split(q), split(k), split(v)
        dots = cosine_distance(f_q, f_k.transpose(-1, -2))  # (h, Q, N, 1)
        out = torch.matmul(dots, f_v)  # (h, Q, N, dh)
        out = out.permute(1, 2, 0, 3).reshape(out.shape[1], out.shape[2], -1)
        return self.output_linear(out)


class CosineDistLinear(nn.Module):
    def __init__(self, indim, outdim):
        super().__init__()
        self.L = nn.utils.parametrizations.weight_norm(nn.Linear(indim, outdim, bias=False), dim=0)
        self.scale_factor = 2

    def forward(self, x):  # (Q, N, d): the norm over the classes, as the official code
        return self.scale_factor * self.L(x / (torch.norm(x, p=2, dim=1, keepdim=True) + 1e-5))


class FsctHead(nn.Module):
    def __init__(self, dim, n, k, heads, dim_head, mlp_dim, depth):
        super().__init__()
        self.depth = depth
        self.ATTN = FsctAttention(dim, heads, dim_head)
        self.proto_weight = nn.Parameter(torch.ones(n, k, 1))
        self.FFN = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))
        self.linear = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim_head), CosineDistLinear(dim_head, 1))

    def forward(self, z_support, z_query):  # (N, K, D), (Q, D) -> (Q, N)
        x = (z_support * self.proto_weight.softmax(-2)).sum(1).unsqueeze(0)
        query = z_query.unsqueeze(1)
        for _ in range(self.depth):
            x = self.ATTN(q=x, k=query, v=query) + x
            x = self.FFN(x) + x
        return self.linear(x).squeeze(-1)

    # memtrain's parameter names (fsct.*) -> this module's.
    NAMES = {
        "proto_weight": "proto_weight",
        "attn_norm.weight": "ATTN.input_linear.0.weight",
        "attn_norm.bias": "ATTN.input_linear.0.bias",
        "attn_in.weight": "ATTN.input_linear.1.weight",
        "attn_out.weight": "ATTN.output_linear.weight",
        "attn_out.bias": "ATTN.output_linear.bias",
        "ffn_norm.weight": "FFN.0.weight",
        "ffn_norm.bias": "FFN.0.bias",
        "ffn_fc1.weight": "FFN.1.weight",
        "ffn_fc1.bias": "FFN.1.bias",
        "ffn_fc2.weight": "FFN.3.weight",
        "ffn_fc2.bias": "FFN.3.bias",
        "out_norm.weight": "linear.0.weight",
        "out_norm.bias": "linear.0.bias",
        "out_fc.weight": "linear.1.weight",
        "out_fc.bias": "linear.1.bias",
        "cos_weight_g": "linear.2.L.parametrizations.weight.original0",
        "cos_weight_v": "linear.2.L.parametrizations.weight.original1",
    }


class FewShotTransformer(nn.Module):
    """The official FewShotTransformer's set_forward over a micro-batch of
    episodes: timm's ResNet-50 embeds all their images at once (batch-norm
    over the micro-batch, as memtrain's backbone), then FsctHead scores each
    episode on its own. x: (m n (k + q), C, H, W), each episode's support
    class-major then its queries class-major (memtrain's EpisodeSource) ->
    logits (m, n q, n)."""

    def __init__(self, in_channels, embed_dim, n, k, q, heads=8, dim_head=64, mlp_dim=512, depth=1):
        super().__init__()
        import timm

        self.n, self.k, self.q = n, k, q
        self.backbone = timm.create_model("resnet50", num_classes=embed_dim, in_chans=in_channels, pretrained=False)
        self.fsct = FsctHead(embed_dim, n, k, heads, dim_head, mlp_dim, depth)
        self._names = {"fsct." + own: "fsct." + mine for mine, own in FsctHead.NAMES.items()}

    def memtrain_name(self, name):
        """memtrain's name of this module's parameter or buffer `name`."""
        return self._names.get(name, name)

    def forward(self, x):
        rows = self.n * (self.k + self.q)
        z = self.backbone(x)
        z = z.view(-1, rows, z.shape[-1])
        support = self.n * self.k
        return torch.stack(
            [self.fsct(e[:support].view(self.n, self.k, -1), e[support:]) for e in z.unbind(0)]
        )


def episode_loss_sum(logits, targets):
    """memtrain's episode_loss_sum: each episode's mean query cross-entropy,
    summed over the micro-batch's episodes."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / logits.shape[1]
