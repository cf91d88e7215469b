/* proc.c: running commands and background processes from the SDK. */
