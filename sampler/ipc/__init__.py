"""What crosses between the backend and its child: the channel and its
messages, and the status block the child keeps."""
