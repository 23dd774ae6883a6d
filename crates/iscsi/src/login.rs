//! Login phase (RFC 7143 §6.3): stage transitions, security negotiation (None / CHAP MD5, one-way
//! and mutual) and operational negotiation, one Login Request at a time.

use std::collections::VecDeque;

use crate::chap::{self, Challenge};
use crate::pdu::{LoginRequestHeader, STAGE_FULL_FEATURE, STAGE_OPERATIONAL, STAGE_SECURITY};
use crate::text::{self, KeyAnswer, Negotiator, SessionType, MAX_TEXT_LEN};
use crate::{Authority, Authorization, ChapCredentials, LoginStatus, SessionInfo, TargetSettings};

/// During login both sides must keep data segments within 8192 bytes (RFC 7143 §13.12).
pub(crate) const LOGIN_MAX_DATA: usize = 8192;

/// What to put in the Login Response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoginReply {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub status: LoginStatus,
    pub tsih: u16,
    pub data: Vec<u8>,
}

#[derive(Debug)]
pub(crate) enum LoginOutcome {
    /// Send the reply and wait for the next request.
    Continue(LoginReply),
    /// Send the reply (a failure status), then close.
    Failed(LoginReply),
    /// Send the reply; the session is in full feature phase.
    Complete(LoginReply, SessionInfo),
}

#[derive(Debug)]
enum Auth {
    /// No AuthMethod negotiated yet.
    NotNegotiated,
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    AwaitingAlgorithm,
    /// Challenge sent; waiting for CHAP_N/CHAP_R.
    AwaitingResponse(Challenge),
    Done,
}

/// The decision made on a complete request, applied with the last chunk of our reply.
#[derive(Debug, Clone, Copy)]
struct Transition {
    csg: u8,
    transit: bool,
    nsg: u8,
}

#[derive(Debug)]
pub(crate) struct Login {
    started: bool,
    isid: [u8; 6],
    stage: u8,
    initiator_name: String,
    initiator_alias: Option<String>,
    target_name: Option<String>,
    session_type: SessionType,
    required_chap: Option<ChapCredentials>,
    auth: Auth,
    negotiator: Negotiator,
    /// Request text accumulated across PDUs with the C bit.
    request_text: Vec<u8>,
    /// Reply text still to send (continued with the C bit), and what to do after its last chunk.
    reply_chunks: VecDeque<Vec<u8>>,
    pending_transition: Option<Transition>,
    sent_first_reply: bool,
    declared_mrdsl: bool,
}

impl Login {
    pub fn new(settings: &TargetSettings) -> Self {
        Self {
            started: false,
            isid: [0; 6],
            stage: STAGE_SECURITY,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: None,
            session_type: SessionType::Normal,
            required_chap: None,
            auth: Auth::NotNegotiated,
            negotiator: Negotiator::new(settings),
            request_text: Vec::new(),
            reply_chunks: VecDeque::new(),
            pending_transition: None,
            sent_first_reply: false,
            declared_mrdsl: false,
        }
    }

    /// Handles one Login Request PDU.
    pub fn on_request(
        &mut self,
        req: &LoginRequestHeader,
        data: &[u8],
        settings: &TargetSettings,
        authority: &dyn Authority,
    ) -> LoginOutcome {
        match self.step(req, data, settings, authority) {
            Ok(outcome) => outcome,
            Err(status) => LoginOutcome::Failed(LoginReply {
                transit: false,
                cont: false,
                csg: req.csg & 3,
                nsg: 0,
                status,
                tsih: 0,
                data: Vec::new(),
            }),
        }
    }

    fn step(
        &mut self,
        req: &LoginRequestHeader,
        data: &[u8],
        settings: &TargetSettings,
        authority: &dyn Authority,
    ) -> Result<LoginOutcome, LoginStatus> {
        self.check_header(req)?;
        if !self.reply_chunks.is_empty() {
            // The initiator fetches the rest of a continued reply with empty requests.
            if !data.is_empty() || req.cont {
                return Err(LoginStatus::InitiatorError);
            }
            return self.next_reply_chunk(settings, authority);
        }
        if self.request_text.len().saturating_add(data.len()) > MAX_TEXT_LEN {
            return Err(LoginStatus::OutOfResources);
        }
        self.request_text.extend_from_slice(data);
        if req.cont {
            // Acknowledge a partial request with an empty response (RFC 7143 §11.12.2).
            return Ok(LoginOutcome::Continue(self.reply(
                req.csg,
                false,
                0,
                Vec::new(),
            )));
        }
        let raw = std::mem::take(&mut self.request_text);
        let pairs = text::parse(&raw).map_err(|_| LoginStatus::InitiatorError)?;

        let csg = req.csg;
        if csg != STAGE_SECURITY && csg != STAGE_OPERATIONAL {
            return Err(LoginStatus::InitiatorError);
        }
        if csg < self.stage {
            return Err(LoginStatus::InitiatorError);
        }
        let first = !self.sent_first_reply;
        if first {
            self.leading_keys(&pairs, authority)?;
        }
        if csg == STAGE_OPERATIONAL && self.stage == STAGE_SECURITY {
            // Skipping the security stage is only allowed when we require no authentication.
            if self.required_chap.is_some() && !matches!(self.auth, Auth::Done) {
                return Err(LoginStatus::AuthenticationFailure);
            }
        }
        self.stage = csg;

        let discovery = self.session_type == SessionType::Discovery;
        let (mut reply, auth_progressed) =
            self.answer_keys(&pairs, csg, discovery, settings, authority)?;

        let transition = self.transition(req, csg, auth_progressed)?;

        self.declare(first, discovery, csg, settings, &mut reply);
        self.sent_first_reply = true;

        let encoded = text::encode(&reply);
        self.reply_chunks = encoded.chunks(LOGIN_MAX_DATA).map(<[u8]>::to_vec).collect();
        self.pending_transition = Some(transition);
        self.next_reply_chunk(settings, authority)
    }

    /// The checks of a request's header against the login so far: the first one starts it
    /// (its version and ISID), every later one must carry the same ISID.
    fn check_header(&mut self, req: &LoginRequestHeader) -> Result<(), LoginStatus> {
        if !self.started {
            // Version 0x00 is the only one defined.
            if req.version_min != 0 {
                return Err(LoginStatus::UnsupportedVersion);
            }
            // We don't do multiple connections per session or connection recovery, so a login
            // naming an existing session can never find one.
            if req.tsih != 0 {
                return Err(LoginStatus::SessionDoesNotExist);
            }
            self.isid = req.isid;
            self.started = true;
        } else if req.isid != self.isid || req.tsih != 0 {
            return Err(LoginStatus::InitiatorError);
        }
        if req.transit && req.cont {
            return Err(LoginStatus::InitiatorError);
        }
        Ok(())
    }

    /// Answers the keys of one complete request at stage `csg`: the reply's keys, and whether
    /// authentication moved on.
    fn answer_keys(
        &mut self,
        pairs: &[(String, String)],
        csg: u8,
        discovery: bool,
        settings: &TargetSettings,
        authority: &dyn Authority,
    ) -> Result<(Vec<(String, String)>, bool), LoginStatus> {
        let batch_max_burst = pairs
            .iter()
            .find(|(k, _)| k == "MaxBurstLength")
            .and_then(|(_, v)| text::parse_number(v));
        let mut reply: Vec<(String, String)> = Vec::new();
        let mut chap_keys = ChapKeys::default();
        let mut auth_progressed = false;
        for (key, value) in pairs {
            match key.as_str() {
                "InitiatorName" | "TargetName" | "SessionType" => {
                    // Declared in the leading request; a repeat must not change anything.
                    let same = match key.as_str() {
                        "InitiatorName" => *value == self.initiator_name,
                        "TargetName" => Some(value.as_str()) == self.target_name.as_deref(),
                        _ => parse_session_type(value) == Some(self.session_type),
                    };
                    if !same {
                        return Err(LoginStatus::InitiatorError);
                    }
                }
                "InitiatorAlias" => self.initiator_alias = Some(value.clone()),
                "AuthMethod" => {
                    self.once(key)?;
                    if csg != STAGE_SECURITY {
                        return Err(LoginStatus::InitiatorError);
                    }
                    let chosen = self.choose_auth_method(value)?;
                    reply.push((key.clone(), chosen.to_owned()));
                    auth_progressed = true;
                }
                "CHAP_A" => {
                    self.once(key)?;
                    if !matches!(self.auth, Auth::AwaitingAlgorithm) {
                        return Err(LoginStatus::InitiatorError);
                    }
                    if !value.split(',').any(|a| a == chap::ALGORITHM_MD5) {
                        return Err(LoginStatus::AuthenticationFailure);
                    }
                    let mut random = [0u8; chap::CHALLENGE_LEN + 1];
                    authority.fill_random(&mut random);
                    let challenge = Challenge::drawn(&random);
                    reply.push((key.clone(), chap::ALGORITHM_MD5.to_owned()));
                    reply.push(("CHAP_I".into(), challenge.identifier.to_string()));
                    reply.push(("CHAP_C".into(), text::encode_hex(&challenge.challenge)));
                    self.auth = Auth::AwaitingResponse(challenge);
                    auth_progressed = true;
                }
                "CHAP_N" | "CHAP_R" | "CHAP_I" | "CHAP_C" => {
                    self.once(key)?;
                    if csg != STAGE_SECURITY {
                        return Err(LoginStatus::InitiatorError);
                    }
                    chap_keys.set(key, value.clone());
                }
                _ => {
                    self.once(key)?;
                    match self.negotiator.answer(
                        settings,
                        key,
                        value,
                        discovery,
                        batch_max_burst,
                    )? {
                        KeyAnswer::Reply(v) => reply.push((key.clone(), v)),
                        KeyAnswer::Silent => {}
                    }
                }
            }
        }
        if chap_keys.any() {
            self.check_chap(&chap_keys, settings, authority, &mut reply)?;
            auth_progressed = true;
        }
        Ok((reply, auth_progressed))
    }

    /// The stage change a request asks for with its T bit, as far as authentication allows.
    fn transition(
        &self,
        req: &LoginRequestHeader,
        csg: u8,
        auth_progressed: bool,
    ) -> Result<Transition, LoginStatus> {
        let mut transition = Transition {
            csg,
            transit: false,
            nsg: 0,
        };
        if req.transit {
            let nsg = req.nsg;
            if nsg <= csg || (nsg != STAGE_OPERATIONAL && nsg != STAGE_FULL_FEATURE) {
                return Err(LoginStatus::InitiatorError);
            }
            let authenticated = match self.auth {
                Auth::Done => true,
                Auth::NotNegotiated => self.required_chap.is_none(),
                Auth::AwaitingAlgorithm | Auth::AwaitingResponse(_) => false,
            };
            if csg == STAGE_SECURITY && !authenticated {
                // Mid-CHAP we hold the transition back; anything else is a failed login.
                if !auth_progressed || matches!(self.auth, Auth::NotNegotiated) {
                    return Err(LoginStatus::AuthenticationFailure);
                }
            } else {
                transition.transit = true;
                transition.nsg = nsg;
            }
        }
        Ok(transition)
    }

    /// What we declare without being asked: the portal group tag (and alias) in the first
    /// response of a normal session; our MaxRecvDataSegmentLength once we are in the
    /// operational stage.
    fn declare(
        &mut self,
        first: bool,
        discovery: bool,
        csg: u8,
        settings: &TargetSettings,
        reply: &mut Vec<(String, String)>,
    ) {
        if first && !discovery {
            reply.push((
                "TargetPortalGroupTag".into(),
                settings.portal_group_tag.to_string(),
            ));
            if let Some(alias) = &settings.target_alias {
                reply.push(("TargetAlias".into(), alias.clone()));
            }
        }
        if csg == STAGE_OPERATIONAL && !self.declared_mrdsl {
            reply.push((
                "MaxRecvDataSegmentLength".into(),
                self.negotiator
                    .params
                    .target_max_recv_data_segment_length
                    .to_string(),
            ));
            self.declared_mrdsl = true;
        }
    }

    /// Sends the next piece of our reply; the transition happens with the last piece.
    fn next_reply_chunk(
        &mut self,
        settings: &TargetSettings,
        authority: &dyn Authority,
    ) -> Result<LoginOutcome, LoginStatus> {
        let chunk = self.reply_chunks.pop_front().unwrap_or_default();
        let Some(transition) = self.pending_transition else {
            return Err(LoginStatus::InitiatorError);
        };
        if !self.reply_chunks.is_empty() {
            let mut r = self.reply(transition.csg, false, 0, chunk);
            r.cont = true;
            return Ok(LoginOutcome::Continue(r));
        }
        self.pending_transition = None;
        if !transition.transit {
            return Ok(LoginOutcome::Continue(self.reply(
                transition.csg,
                false,
                0,
                chunk,
            )));
        }
        self.stage = transition.nsg;
        if transition.nsg != STAGE_FULL_FEATURE {
            return Ok(LoginOutcome::Continue(self.reply(
                transition.csg,
                true,
                transition.nsg,
                chunk,
            )));
        }
        let mut params = self.negotiator.params.clone();
        if !self.declared_mrdsl {
            // We never declared ours, so the default is in force for what we receive.
            params.target_max_recv_data_segment_length = LOGIN_MAX_DATA as u32;
        }
        params.first_burst_length = params.first_burst_length.min(params.max_burst_length);
        let _ = settings;
        let mut info = SessionInfo {
            initiator_name: self.initiator_name.clone(),
            initiator_alias: self.initiator_alias.clone(),
            isid: self.isid,
            tsih: 0,
            session_type: self.session_type,
            target_name: self.target_name.clone(),
            params,
        };
        info.tsih = authority.register_session(&info)?;
        let mut r = self.reply(transition.csg, true, STAGE_FULL_FEATURE, chunk);
        r.tsih = info.tsih;
        Ok(LoginOutcome::Complete(r, info))
    }

    fn reply(&self, csg: u8, transit: bool, nsg: u8, data: Vec<u8>) -> LoginReply {
        LoginReply {
            transit,
            cont: false,
            csg,
            nsg,
            status: LoginStatus::Success,
            tsih: 0,
            data,
        }
    }

    fn once(&mut self, key: &str) -> Result<(), LoginStatus> {
        if self.negotiator.first_time(key) {
            Ok(())
        } else {
            Err(LoginStatus::InitiatorError)
        }
    }

    /// InitiatorName, SessionType and TargetName from the leading request, then authorization.
    fn leading_keys(
        &mut self,
        pairs: &[(String, String)],
        authority: &dyn Authority,
    ) -> Result<(), LoginStatus> {
        let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let name = get("InitiatorName")
            .filter(|n| !n.is_empty())
            .ok_or(LoginStatus::MissingParameter)?;
        self.initiator_name = name.clone();
        self.session_type = match get("SessionType") {
            None => SessionType::Normal,
            Some(v) => parse_session_type(v).ok_or(LoginStatus::SessionTypeNotSupported)?,
        };
        if self.session_type == SessionType::Normal {
            let target = get("TargetName")
                .filter(|n| !n.is_empty())
                .ok_or(LoginStatus::MissingParameter)?;
            self.target_name = Some(target.clone());
        } else {
            self.target_name = None;
        }
        match authority.authorize(&self.initiator_name, self.target_name.as_deref()) {
            Authorization::Allow { chap } => self.required_chap = chap,
            Authorization::NotFound => return Err(LoginStatus::NotFound),
            Authorization::Denied => return Err(LoginStatus::AuthorizationFailure),
        }
        Ok(())
    }

    fn choose_auth_method(&mut self, offered: &str) -> Result<&'static str, LoginStatus> {
        let offers: Vec<&str> = offered.split(',').collect();
        if self.required_chap.is_some() {
            if offers.contains(&"CHAP") {
                self.auth = Auth::AwaitingAlgorithm;
                return Ok("CHAP");
            }
        } else if offers.contains(&"None") {
            self.auth = Auth::Done;
            return Ok("None");
        }
        // Either CHAP is required and not offered, or only methods we can't check are.
        Err(LoginStatus::AuthenticationFailure)
    }

    fn check_chap(
        &mut self,
        keys: &ChapKeys,
        settings: &TargetSettings,
        authority: &dyn Authority,
        reply: &mut Vec<(String, String)>,
    ) -> Result<(), LoginStatus> {
        let Auth::AwaitingResponse(ours) = &self.auth else {
            return Err(LoginStatus::AuthenticationFailure);
        };
        let (Some(user), Some(response)) = (&keys.name, &keys.response) else {
            return Err(LoginStatus::AuthenticationFailure);
        };
        let response = text::decode_binary(response).ok_or(LoginStatus::AuthenticationFailure)?;
        let expected = self
            .required_chap
            .as_ref()
            .ok_or(LoginStatus::AuthenticationFailure)?;
        if !ours.verify(expected, user, &response) {
            authority.chap_failed(&self.initiator_name);
            return Err(LoginStatus::AuthenticationFailure);
        }
        match (&keys.identifier, &keys.challenge) {
            (None, None) => {}
            (Some(id), Some(challenge)) => {
                // Mutual CHAP: prove our identity with the target secret.
                let target = settings
                    .mutual_chap
                    .as_ref()
                    .ok_or(LoginStatus::AuthenticationFailure)?;
                let id = text::parse_number(id)
                    .and_then(|v| u8::try_from(v).ok())
                    .ok_or(LoginStatus::AuthenticationFailure)?;
                let challenge =
                    text::decode_binary(challenge).ok_or(LoginStatus::AuthenticationFailure)?;
                // A reflected challenge would make us compute the initiator's answer for it.
                if challenge == ours.challenge || challenge.len() > chap::MAX_CHALLENGE_LEN {
                    return Err(LoginStatus::AuthenticationFailure);
                }
                let answer = chap::response(id, &target.secret, &challenge);
                reply.push(("CHAP_N".into(), target.user.clone()));
                reply.push(("CHAP_R".into(), text::encode_hex(&answer)));
            }
            _ => return Err(LoginStatus::AuthenticationFailure),
        }
        self.auth = Auth::Done;
        Ok(())
    }
}

fn parse_session_type(v: &str) -> Option<SessionType> {
    match v {
        "Normal" => Some(SessionType::Normal),
        "Discovery" => Some(SessionType::Discovery),
        _ => None,
    }
}

#[derive(Debug, Default)]
struct ChapKeys {
    name: Option<String>,
    response: Option<String>,
    identifier: Option<String>,
    challenge: Option<String>,
}

impl ChapKeys {
    fn set(&mut self, key: &str, value: String) {
        let slot = match key {
            "CHAP_N" => &mut self.name,
            "CHAP_R" => &mut self.response,
            "CHAP_I" => &mut self.identifier,
            _ => &mut self.challenge,
        };
        *slot = Some(value);
    }
    fn any(&self) -> bool {
        self.name.is_some()
            || self.response.is_some()
            || self.identifier.is_some()
            || self.challenge.is_some()
    }
}
