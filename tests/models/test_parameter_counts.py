"""Parameter counts against numbers computed by hand (and torchvision's published counts).

torchvision's counts for 1,000 classes on 3-channel images (``sum(p.numel() for p in
torchvision.models.X().parameters())``, also in torchvision's model documentation): resnet18
11,689,512; resnet34 21,797,672; alexnet 61,100,840; googlenet (aux_logits=False) 6,624,904;
mobilenet_v2 3,504,872. With c classes each loses (features + 1) * (1000 - c) parameters of the
classifier (features: 512, 512, 4096, 1024, 1280)."""
from __future__ import annotations

from argparse import Namespace

import pytest

from flcore.flat import FlatModel
from flcore.registry import MODELS, load_all

load_all()


def count(name, input_shape, num_classes, args=None):
    model = MODELS.get(name)(input_shape, num_classes, args)
    return sum(p.numel() for p in model.parameters())


def classifier_delta(features: int, classes: int) -> int:
    """Parameters the 1,000-class classifier has more than a ``classes``-class one."""
    return (features + 1) * (1000 - classes)


TORCHVISION = {  # name: (parameters with 1,000 classes, classifier input features)
    "ResNet18": (11_689_512, 512),
    "ResNet34": (21_797_672, 512),
    "AlexNet": (61_100_840, 4096),
    "GoogleNet": (6_624_904, 1024),
    "MobileNet": (3_504_872, 1280),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TORCHVISION))
def test_torchvision_architectures_have_torchvision_counts(name):
    total, features = TORCHVISION[name]
    assert count(name, (3, 64, 64), 1000) == total
    # CIFAR-10: 3x32x32, 10 classes (AlexNet needs 63x63 and up, its count does not depend on the size)
    shape = (3, 64, 64) if name == "AlexNet" else (3, 32, 32)
    assert count(name, shape, 10) == total - classifier_delta(features, 10)


def test_resnet18_for_cifar10_is_pfllibs_11181642():
    # torchvision.models.resnet18(num_classes=10), PFLlib's -m ResNet18: 11,689,512 - 513 * 990
    assert count("ResNet18", (3, 32, 32), 10) == 11_181_642


def test_resnet10_is_pfllibs():
    """PFLlib's resnet10 (one basic block per stage), 3x32x32, 10 classes, by hand:
    stem conv 3*64*49 = 9,408 + norm 128; stage 1: two 3x3 64->64 convs 2*36,864 + 2*128 = 73,984;
    stage 2: 64*128*9 + 128*128*9 + 1x1 shortcut 64*128 + 3 norms of 256 = 230,144;
    stage 3: 128*256*9 + 256*256*9 + 128*256 + 3*512 = 919,040;
    stage 4: 256*512*9 + 512*512*9 + 256*512 + 3*1024 = 3,673,088; classifier 512*10 + 10 = 5,130."""
    expected = 9_408 + 128 + 73_984 + 230_144 + 919_040 + 3_673_088 + 5_130
    assert expected == 4_910_922
    assert count("ResNet10", (3, 32, 32), 10) == expected


@pytest.mark.parametrize("name", ["ResNet10", "ResNet18", "GoogleNet", "MobileNet"])
def test_groupnorm_variants_keep_the_parameter_count(name):
    # GroupNorm has BatchNorm's affine weight and bias per channel, and no buffers
    assert count(f"{name}-GN", (3, 32, 32), 10) == count(name, (3, 32, 32), 10)
    assert FlatModel(MODELS.get(f"{name}-GN")((3, 32, 32), 10)).num_total == count(name, (3, 32, 32), 10)


def test_first_layer_adapts_to_the_channels():
    # 1x28x28 instead of 3x32x32: the stem convolution has 64 * 7 * 7 * 2 fewer weights
    assert count("ResNet18", (3, 32, 32), 10) - count("ResNet18", (1, 28, 28), 10) == 64 * 49 * 2


def test_harcnn_for_har_and_pamap2():
    """conv (1,9) 9->32: 9*32*9 + 32 = 2,624; conv 32->64: 32*64*9 + 64 = 18,496; FC 1024 on
    64 * 26 = 1,664 features (HAR, 128 steps): 1664*1024 + 1024 = 1,704,960;
    FC 512: 1024*512 + 512 = 524,800; classifier 512*6 + 6 = 3,078. PAMAP2 (256 steps): 64 * 58
    = 3,712 features (PFLlib's dim_hidden) and 12 classes."""
    assert count("HARCNN", (9, 1, 128), 6) == 2_624 + 18_496 + 1_704_960 + 524_800 + 3_078 == 2_253_958
    assert count("HARCNN", (9, 1, 256), 12) == 2_624 + 18_496 + (3_712 * 1024 + 1024) + 524_800 + (512 * 12 + 12)


def test_amazon_mlp():
    # 5000*1000+1000 + 1000*500+500 + 500*100+100 + 100*2+2
    assert count("AmazonMLP", (5000,), 2) == 5_001_000 + 500_500 + 50_100 + 202 == 5_551_802


@pytest.mark.slow
def test_digit5_cnn():
    """convs 5x5: 3*64*25+64 = 4,864; 64*64*25+64 = 102,464; 64*128*25+128 = 204,928; norms
    2*(64+64+128) = 512; FC 128*8*8 = 8,192 -> 3072: 25,168,896 + norm 6,144; FC 3072 -> 2048:
    6,293,504 + norm 4,096; classifier 2048*10+10 = 20,490."""
    expected = 4_864 + 102_464 + 204_928 + 512 + 25_168_896 + 6_144 + 6_293_504 + 4_096 + 20_490
    assert count("Digit5CNN", (3, 32, 32), 10) == expected == 31_805_898
    assert count("Digit5CNN-GN", (3, 32, 32), 10) == expected


def test_vgg9_is_fedmas():
    """FedMA's VGG-9 on CIFAR-10, 3x3 convolutions: 3*32*9+32 = 896; 32*64*9+64 = 18,496;
    64*128*9+128 = 73,856; 128*128*9+128 = 147,584; 128*256*9+256 = 295,168; 256*256*9+256 =
    590,080; FC 256*4*4 = 4,096 -> 512: 2,097,664; FC 512 -> 512: 262,656; classifier 5,130. On
    MNIST the first convolution has one input channel (320) and the FC input is 256*3*3 = 2,304."""
    expected = 896 + 18_496 + 73_856 + 147_584 + 295_168 + 590_080 + 2_097_664 + 262_656 + 5_130
    assert count("VGG9", (3, 32, 32), 10) == expected == 3_491_530
    mnist = expected - 896 + 320 - 2_097_664 + (2_304 * 512 + 512)
    assert count("VGG9", (1, 28, 28), 10) == mnist == 2_573_450


def test_sageflow_cnn_is_the_official_cnnmnist():
    """savertm/Sageflow's CNNMnist: 1*32*25+32 = 832; 32*64*25+64 = 51,264; padding keeps 28 -> 14 -> 7,
    so FC 64*7*7 = 3,136 -> 1024: 3,212,288; classifier 1024*10+10 = 10,250."""
    assert count("SageflowCNN", (1, 28, 28), 10) == 832 + 51_264 + 3_212_288 + 10_250 == 3_274_634


def test_cnn_bn_adds_norms_and_float_buffers_to_the_vector():
    """FedAvg CNN on MNIST: 1*32*25+32 + 32*64*25+64 + 1024*512+512 + 512*10+10 = 582,026; the three
    norms add 2*(32+64+512) = 1,216 parameters and as many running-statistic floats."""
    assert count("CNN", (1, 28, 28), 10) == 832 + 51_264 + 524_800 + 5_130 == 582_026
    flat = FlatModel(MODELS.get("CNN-BN")((1, 28, 28), 10))
    assert flat.num_params == 582_026 + 1_216
    assert flat.num_total == flat.num_params + 1_216  # running means and variances, in the vector
    assert not any(s.in_head for s in flat.segments if not s.is_param)


TEXT = Namespace(vocab_size=80, feature_dim=32, max_len=200)  # Shakespeare's 80 symbols, -fd 32


@pytest.mark.parametrize("name,expected", [
    # embedding 80*32 = 2,560 in each; classifiers with 4 classes
    ("fastText", 2_560 + (32 * 32 + 32) + (32 * 4 + 4)),  # 3,748
    # LSTM layer: 4 gates * 32 * (32 + 32) weights + 2 * 4 * 32 biases = 8,448; two layers
    ("LSTM", 2_560 + 2 * 8_448 + (32 * 4 + 4)),  # 19,588
    # one bidirectional layer = two directions of 8,448; classifier on 64 features
    ("BiLSTM", 2_560 + 2 * 8_448 + (64 * 4 + 4)),  # 19,716
    # filters k=3,4,5: 100*32*k + 100 each; classifier 300 -> 4
    ("TextCNN", 2_560 + (9_700 + 12_900 + 16_100) + (300 * 4 + 4)),  # 42,464
    # per encoder layer: attention in 3*32*32+96, out 32*32+32, FF 32*2048+2048 and 2048*32+32,
    # two LayerNorms 2*64 = 137,504; [CLS] token 32
    ("Transformer", 2_560 + 32 + 2 * (3_168 + 1_056 + 67_584 + 65_568 + 128) + (32 * 4 + 4)),  # 277,732
])
def test_text_models(name, expected):
    assert count(name, (200,), 4, TEXT) == expected


def test_bag_of_words_lr_is_tffs_dense_layer():
    # -vs counts padding and out-of-vocabulary: 78 words -> 20 tags, and a bias per tag
    assert count("BoWLR", (16,), 20, TEXT) == 78 * 20 + 20
    # TFF's StackOverflow setting: 10,000 words, 500 tags
    assert count("BoWLR", (16,), 500, Namespace(vocab_size=10_002, feature_dim=32, max_len=16)) == 5_000_500


def test_text_models_scale_with_the_vocabulary():
    bigger = Namespace(vocab_size=1080, feature_dim=32, max_len=200)
    for name in ("fastText", "LSTM", "BiLSTM", "TextCNN", "Transformer"):
        assert count(name, (200,), 4, bigger) - count(name, (200,), 4, TEXT) == 1000 * 32


def test_simple_cnn_is_niid_benchs():
    # conv 1->6 5x5: 150 + 6; conv 6->16 5x5: 2,400 + 16; FC 16*4*4 -> 120: 30,720 + 120;
    # FC 120 -> 84: 10,080 + 84; classifier 84 -> 10: 840 + 10 (3x32x32: FC 16*5*5 -> 120 = 48,000 + 120)
    assert count("SimpleCNN", (1, 28, 28), 10) == 156 + 2_416 + 30_840 + 10_164 + 850 == 44_426
    assert count("SimpleCNN", (3, 32, 32), 10) == 456 + 2_416 + 48_120 + 10_164 + 850 == 62_006
