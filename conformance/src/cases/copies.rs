//! (cases of this family are being added)

use hisparse_core::Device;

use crate::Case;

pub(crate) fn cases<D: Device + 'static>(_v: &mut Vec<Case<D>>) {}
