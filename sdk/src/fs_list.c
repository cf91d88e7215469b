/* fs_list.c: directory listings and watches in the SDK. */
