"""Files and the OpenAI Batch API: the batch door (service); the feeder's loop (feeder) and its
parts: the input file's validation and cursor reads (input_file), the window of lines in flight
(window), result parts and files (results), the capacity rule and fair shares (capacity); line
parsing and result lines (lines), file records (files) and storage (filestore)."""
