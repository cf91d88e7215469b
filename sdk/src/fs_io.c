/* fs_io.c: streamed file reads and writes in the SDK. */
