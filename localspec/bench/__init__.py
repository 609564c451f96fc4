"""`localspec bench`: workloads, an interleaved runner against plain decoding, anchors
(llama-cpp-python's and llama.cpp's own speculation), and the table and chart."""
