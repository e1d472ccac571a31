"""Image-file datasets (kvasir, TinyImagenet, Country211, Flowers102, GTSRB, COVIDx, Omniglot)
from small archives and folders in their real layouts; downloads only from 127.0.0.1."""

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import REPO
from datagen_helpers import (LocalServer, all_labels, image_bytes, load_client, md5, read_config,
                             write_tgz, write_tree, write_zip)

from datagen import download, image_datasets, image_folders
from datagen.errors import ReadError


def run_script(script, *args, env=None):
    return subprocess.run([sys.executable, script, *args], cwd=REPO / "dataset", env=env,
                          capture_output=True, text=True, timeout=120)


def red(image):
    """The red value of a flat decoded image (identifies the sample)."""
    return int(image[0, 0, 0])


def test_kvasir_zip_generator_end_to_end(tmp_path):
    members = {f"kvasir-dataset-v2/{c}/{i}.jpg": image_bytes(10 * k + i, fmt="JPEG")
               for k, c in enumerate(image_datasets.KVASIR_CLASSES) for i in range(3)}
    members["kvasir-dataset-v2/index.html"] = b"<html></html>"
    archive = write_zip(tmp_path / "raw" / "kvasir-dataset-v2.zip", members)
    out = tmp_path / "kvasir"
    proc = run_script("generate_kvasir.py", "noniid", "-", "pat", "--num-clients", "4",
                      "--image-size", "16", "--raw-dir", str(archive.parent), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_classes"] == 8 and config["input_shape"] == [3, 16, 16]
    assert config["image_size"] == 16
    assert np.bincount(all_labels(out)).tolist() == [3] * 8


def test_tinyimagenet_val_images_get_their_annotated_labels(tmp_path):
    wnids = [f"n{k:08d}" for k in range(200)]
    members = {"tiny-imagenet-200/wnids.txt": "\n".join(reversed(wnids)).encode()}
    for k, w in enumerate(wnids):
        members[f"tiny-imagenet-200/train/{w}/images/{w}_0.JPEG"] = image_bytes(k % 256, (64, 64))
        members[f"tiny-imagenet-200/train/{w}/{w}_boxes.txt"] = b"x"
    annotations = []
    for i, k in enumerate([5, 17, 199]):
        members[f"tiny-imagenet-200/val/images/val_{i}.JPEG"] = image_bytes(k % 256, (64, 64))
        annotations.append(f"val_{i}.JPEG\t{wnids[k]}\t0\t0\t10\t10")
    members["tiny-imagenet-200/val/val_annotations.txt"] = "\n".join(annotations).encode()
    archive = write_zip(tmp_path / "tiny-imagenet-200.zip", members)
    data = image_datasets.load_tiny(archive, tmp_path / "dl", ("train", "val"), 64)
    assert data.num_classes == 200 and data.num_train == 200 and len(data.y) == 203
    assert data.y[-3:].tolist() == [5, 17, 199]  # PFLlib #231 would give 0, 0, 0
    assert [red(x) for x in data.x[-3:]] == [5, 17, 199 % 256]
    assert data.y[:200].tolist() == list(range(200)) and red(data.x[7]) == 7
    train_only = image_datasets.load_tiny(archive, tmp_path / "dl", ("train",), 8)
    assert len(train_only.y) == 200 and train_only.x.shape[1:] == (3, 8, 8)


def test_country211_tgz_is_streamed_with_splits(tmp_path):
    members = {}
    for split, n in (("train", 2), ("valid", 1), ("test", 1)):
        for k, cc in enumerate(["AD", "FR", "JP"]):
            for i in range(n):
                members[f"country211/{split}/{cc}/{split}{i}.jpg"] = image_bytes(40 * k, fmt="JPEG")
    archive = write_tgz(tmp_path / "country211.tgz", members)
    data = image_datasets.load_country211(tmp_path, tmp_path / "dl", ("train", "test"), 16)
    assert data.class_names == ["AD", "FR", "JP"] and data.num_train == 6 and len(data.y) == 9
    assert data.extra_config["splits"] == ["train", "test"]
    assert archive.is_file()


def test_flowers102_downloaded_from_local_mirror_with_checksums(tmp_path, monkeypatch):
    from scipy.io import savemat
    www = tmp_path / "www"
    labels = np.array([3, 1, 102, 3, 50, 7])
    write_tgz(www / "102flowers.tgz", {f"jpg/image_{i:05d}.jpg": image_bytes(i * 30, fmt="JPEG")
                                       for i in range(1, 7)})
    savemat(www / "imagelabels.mat", {"labels": labels[None, :]})
    savemat(www / "setid.mat", {"trnid": np.array([[1, 2, 3]]), "valid": np.array([[4]]),
                                "tstid": np.array([[5, 6]])})
    files = tuple(download.RemoteFile(n, md5(www / n))
                  for n in ("102flowers.tgz", "imagelabels.mat", "setid.mat"))
    monkeypatch.setattr(image_datasets, "FLOWERS", replace(image_datasets.FLOWERS, files=files))
    with LocalServer(www) as server:
        monkeypatch.setenv(download.MIRROR_ENV, server.url)
        data = image_datasets.load_flowers(None, tmp_path / "dl", ("train", "test"), 8)
    assert data.y.tolist() == [2, 0, 101, 49, 6] and data.num_train == 3
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == sorted(f.name for f in files)


def test_flowers102_published_checksums_and_missing_mat(tmp_path):
    assert {f.name: f.md5 for f in image_datasets.FLOWERS.files}["102flowers.tgz"] == \
        "52808999861908f626f3c1f4e79d11fa"
    write_tgz(tmp_path / "102flowers.tgz", {"jpg/image_00001.jpg": image_bytes(1, fmt="JPEG")})
    with pytest.raises(ReadError, match="imagelabels.mat: file not found"):
        image_datasets.load_flowers(tmp_path, tmp_path / "dl", ("train",), 8)


def test_gtsrb_train_folders_and_test_ground_truth(tmp_path):
    train = {f"GTSRB/Training/{k:05d}/00000_0000{i}.ppm": image_bytes(k * 5, fmt="PPM")
             for k in (0, 1, 42) for i in range(2)}
    train["GTSRB/Training/00000/GT-00000.csv"] = b"Filename;ClassId\n"
    write_zip(tmp_path / "GTSRB-Training_fixed.zip", train)
    write_zip(tmp_path / "GTSRB_Final_Test_Images.zip",
              {f"GTSRB/Final_Test/Images/0000{i}.ppm": image_bytes(200 + i, fmt="PPM")
               for i in range(3)})
    gt = "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2;ClassId\n" + "".join(
        f"0000{i}.ppm;12;10;0;0;5;5;{c}\n" for i, c in enumerate([42, 0, 7]))
    write_zip(tmp_path / "GTSRB_Final_Test_GT.zip", {"GT-final_test.csv": gt.encode()})
    data = image_datasets.load_gtsrb(tmp_path, tmp_path / "dl", ("train", "test"), 32)
    assert data.num_classes == 43 and data.num_train == 6
    assert data.y.tolist() == [0, 0, 1, 1, 42, 42, 42, 0, 7]
    assert [red(x) for x in data.x[6:]] == [200, 201, 202]
    only_train = image_datasets.load_gtsrb(tmp_path, tmp_path / "dl", ("train",), 32)
    assert len(only_train.y) == 6 and only_train.num_train is None


def test_covidx_folder_and_missing_image(tmp_path):
    members = {f"{s}/{s}{i}.png": image_bytes(i, grey=True, fmt="PNG")
               for s in ("train", "test") for i in range(3)}
    write_tree(tmp_path, members)
    (tmp_path / "train.txt").write_text("".join(f"p{i} train{i}.png {'positive' if i else 'negative'}"
                                                f" src\n" for i in range(3)))
    (tmp_path / "test.txt").write_text("p9 test0.png negative src\np9 test1.png positive src\n")
    data = image_datasets.load_covidx(tmp_path, tmp_path / "dl", ("train", "test"), 8)
    assert data.y.tolist() == [0, 1, 1, 0, 1] and data.x.shape == (5, 3, 8, 8)
    (tmp_path / "train" / "train2.png").unlink()
    with pytest.raises(ReadError, match="1 images listed in the split files are missing"):
        image_datasets.load_covidx(tmp_path, tmp_path / "dl", ("train", "test"), 8)
    with pytest.raises(ReadError, match="val.txt: file not found"):
        image_datasets.load_covidx(tmp_path, tmp_path / "dl", ("train", "val", "test"), 8)
    write_tree(tmp_path, {"val/v0.png": image_bytes(9, grey=True, fmt="PNG")})
    (tmp_path / "val.txt").write_text("p7 v0.png positive src\n")
    (tmp_path / "train" / "train2.png").write_bytes(image_bytes(2, grey=True, fmt="PNG"))
    with_val = image_datasets.load_covidx(tmp_path, tmp_path / "dl", ("train", "val", "test"), 8)
    # The first split is the training set; val joins the official test part.
    assert with_val.y.tolist() == [0, 1, 1, 1, 0, 1] and with_val.num_train == 3
    proc = run_script("generate_COVIDx.py", "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "Kaggle" in proc.stderr and proc.stderr.count("\n") == 1


def test_omniglot_natural_clients_are_alphabets(tmp_path):
    for split, alphabets in (("background", ["Greek", "Latin"]), ("evaluation", ["Tengwar"])):
        write_zip(tmp_path / f"images_{split}.zip",
                  {f"images_{split}/{a}/character{c:02d}/{a}{c}_{i}.png":
                   image_bytes(c * 10 + i, (105, 105), grey=True)
                   for a in alphabets for c in range(1, 3 + (a == "Latin")) for i in range(2)})
    out = tmp_path / "Omniglot"
    proc = run_script("generate_Omniglot.py", "--raw-dir", str(tmp_path), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["num_clients"] == 3 and config["num_classes"] == 7
    assert config["client_names"] == ["Latin", "Greek", "Tengwar"]
    assert config["input_shape"] == [1, 28, 28]
    x, y = load_client(out, "train", 0)
    assert x.shape[1:] == (1, 28, 28)
    assert set(np.concatenate([y, load_client(out, "test", 0)[1]]).tolist()) <= {2, 3, 4}


def test_corrupt_image_and_archive_are_one_line_errors(tmp_path):
    bad = write_zip(tmp_path / "kvasir-dataset-v2.zip", {"kvasir-dataset-v2/polyps/a.jpg": b"nope"})
    with pytest.raises(ReadError, match="not a readable image"):
        image_datasets.load_kvasir(bad, tmp_path, ("all",), 8)
    (tmp_path / "broken.tgz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ReadError, match="corrupt or truncated"):
        list(image_folders.iter_files(tmp_path / "broken.tgz", lambda n: True))


def test_camelyon17_wilds_folder_hospitals_as_clients(tmp_path):
    root = tmp_path / "camelyon17_v1.0"
    # WILDS's layout: an unnamed index column, patient ids with leading zeros.
    rows = [",patient,node,x_coord,y_coord,tumor,slide,center,split"]
    members = {}
    for i, (patient, center, tumor) in enumerate([(4, 0, 1), (4, 0, 0), (10, 1, 0), (10, 1, 1),
                                                  (10, 1, 1), (99, 4, 0)]):
        name = (f"patches/patient_{patient:03d}_node_2/patch_patient_{patient:03d}_node_2"
                f"_x_{i * 96}_y_{i}.png")
        members[name] = image_bytes(i * 20, (96, 96))
        rows.append(f"{i},{patient:03d},2,{i * 96},{i},{tumor},{patient // 5},{center},0")
    write_tree(root, members)
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "Camelyon17"
    proc = run_script("generate_Camelyon17.py", "--raw-dir", str(tmp_path), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    config = read_config(out)
    assert config["client_names"] == ["hospital 1", "hospital 0", "hospital 4"]
    assert config["num_classes"] == 2 and config["input_shape"] == [3, 32, 32]
    y = np.concatenate([load_client(out, s, 0)[1] for s in ("train", "test")])
    assert sorted(y.tolist()) == [0, 1, 1]
    (root / next(iter(members))).unlink()
    from datagen import wilds_sources
    with pytest.raises(ReadError, match="image listed in metadata.csv not found"):
        wilds_sources.read_camelyon17(tmp_path)


def test_iwildcam_wilds_folder_locations_as_clients(tmp_path):
    from datagen import wilds_sources
    root = tmp_path / "iwildcam_v2.0"
    rows = ["split,location_remapped,y,filename"]
    members = {}
    for i, (loc, y) in enumerate([(0, 0), (0, 5), (7, 181), (7, 0), (7, 5)]):
        members[f"train/img{i}.jpg"] = image_bytes(i * 40, (40, 30), fmt="JPEG")
        rows.append(f"train,{loc},{y},img{i}.jpg")
    write_tree(root, members)
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    data = wilds_sources.read_iwildcam(tmp_path, size=16)
    assert data.num_classes == 182 and data.x.shape == (5, 3, 16, 16)
    assert data.groups.tolist() == [0, 0, 7, 7, 7] and data.y.tolist() == [0, 5, 181, 0, 5]
    proc = run_script("generate_iWildCam.py", "--out-dir", str(tmp_path / "o"))
    assert proc.returncode == 2 and "wilds.get_dataset" in proc.stderr


def test_stanford_cars_kaggle_folder(tmp_path):
    from scipy.io import savemat

    from datagen import misc_sources
    root = tmp_path / "stanford_cars"
    for split, labels in (("train", [196, 1, 5]), ("test", [2])):
        folder = "cars_train" if split == "train" else "cars_test"
        annos = np.zeros(len(labels), dtype=[("fname", object), ("class", object)])
        for i, label in enumerate(labels):
            annos[i] = (f"{i:05d}.jpg", label)
            write_tree(root / folder, {f"{i:05d}.jpg": image_bytes(label, (30, 20), fmt="JPEG")})
        mat = "devkit/cars_train_annos.mat" if split == "train" else "cars_test_annos_withlabels.mat"
        (root / mat).parent.mkdir(parents=True, exist_ok=True)
        savemat(root / mat, {"annotations": annos[None, :]})
    names = np.array([f"car {k}" for k in range(196)], dtype=object)
    savemat(root / "devkit" / "cars_meta.mat", {"class_names": names[None, :]})
    data = misc_sources.read_stanford_cars(tmp_path, ("train", "test"), 16)
    assert data.y.tolist() == [195, 0, 4, 1] and data.num_train == 3
    assert data.class_names[195] == "car 195" and data.x.shape == (4, 3, 16, 16)
    out = tmp_path / "StanfordCars"
    proc = run_script("generate_StanfordCars.py", "iid", "balance", "-", "--num-clients", "1",
                      "--raw-dir", str(tmp_path), "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert read_config(out)["num_classes"] == 196
