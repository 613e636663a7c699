"""A third-party object detector for Funnel: a YOLOv8-style graph, letterboxed images in, boxes in
the image's own pixels out."""
