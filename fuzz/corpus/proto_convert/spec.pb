
s@ €(€RRMSNorm"*:replayb