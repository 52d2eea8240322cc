"""COCO-format detection data, shared by the detection workloads (SSD, RetinaNet, Mask R-CNN): the
instances-file reader and its checks, datasets and batches, the mini generator, and COCO AP."""
